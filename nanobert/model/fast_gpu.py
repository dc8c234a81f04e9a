"""The fast layer on CuPy (GPU): CUDA kernels (kernels.cu) in place of NumPy's in-place
sequences. fast.py routes each op here for CuPy arrays (fast_cpu.py holds the NumPy twin);
each function has the signature, the cache and the results of its reference twin in ops.py
(read the math there), proven equal to it on the CPU stand-in of CuPy
(tests/test_cupy_standin.py: arithmetic and launch counts, not CUDA's rounding or speed).

What costs time on a GPU (docs/gpu.md, measured on an H200): each CuPy call costs ~10 us of
host time whatever its size, so a step should make few of them (fused kernels); the host must
never wait (losses stay on the device as 0-d arrays, read when the caller logs). Matrix
products and column sums call cuBLAS directly (gemm, column_sum): CuPy's batched matmul
ignores TF32, casts float16 up and copies strided operands, and its column sums read at a
fraction of the bandwidth. LayerNorm, Add & Norm (dropout + residual + LayerNorm), the
attention's mask + softmax + dropout and the cross-entropy are one row kernel each (one warp a
row), forward and backward; GELU, dropout and the attention's layout moves one map kernel each
(16 bytes of each input a thread); GELU's backward after the up-projection also sums its bias
gradient (tiles of rows, no atomics). The
attention can run fused instead (FlashAttention-2's tiles: no [B, A, T, T] array; float16 on
tensor cores), where $NANOBERT_FUSED_ATTENTION asks for it (_fused_attention_forward).
Dropout draws its keep mask inside those kernels from a counter-based generator
(counter_rng.CounterGenerator, Philox4x32-10): no cuRAND draw, no mask kept; the backward
regenerates it from the forward's DropoutDraw. What each choice measured on an H200 is in
its comment and in docs/gpu.md ("What each change did"); the CUDA kernels are not measured
yet (docs/gpu.md says what they are expected to save).

The MLM decoder's vocab, 30,522, is no multiple of a 16-byte load: its logits come in rows
padded to a multiple of 64 and its products split, so that their bulk may run on vectorized
cuBLAS kernels (_output_rows, _split_wide).

Mixed precision (float16 activations), as NVIDIA's BERT recipe: matmuls, residual adds and
dropout in float16; LayerNorm, softmax, GELU and the losses compute in float32; parameter
gradients summed into float32 buffers.
"""
import math
import os
from typing import NamedTuple

import numpy

from ..backend import HALF, array_module, float32_if_half, tf32_enabled
from . import cublas, kernels, ops
from .ops import AttentionCache



# ------------------------------------------------------------------------ cuBLAS directly
# CuPy 14's batched matmul (ndim > 2) calls cuBLAS in plain FP32 whatever the TF32 setting,
# casts float16 operands up to float32 (3 cast kernels a product) and copies every operand
# that is not C-contiguous; its 2-D path honours TF32. gemm() below calls
# gemmStridedBatchedEx itself: tensor cores for float16 (float32 accumulation) and for
# float32 when TF32 is on, transposes as cuBLAS's op flags, any row stride. float64 keeps
# CUBLAS_COMPUTE_64F: the same math as NumPy's.


def gemm(a, b, out, transpose_a=False, transpose_b=False, exact=False, alpha=1.0,
         accumulate=False):
    """out[s] = alpha op(a[s]) @ op(b[s]) (+ out[s] if accumulate) for stacks [S..., rows,
    cols] of row-major matrices (op a transpose when asked), one cuBLAS call (two for a wide
    unaligned extent: _split_wide): each matrix's elements in a row adjacent, rows any
    distance apart (a view of wider rows is read in place), and the stack's matrices equally
    spaced. out may be float32 for float16 operands (the sum rounded once, into a float32
    gradient buffer); exact: float32 never in TF32 (sums that must keep float32's precision).
    cuBLAS is column-major: the row-major out = A B is its out^T = B^T A^T, so B goes first.
    Host cost (an H200's host, measured): CuPy's 2-D matmul takes 17.5 us a call; checking
    the layout and working out cuBLAS's arguments in Python took ~8 us more, so that is done
    once per layout (_plan) and a call is a dictionary lookup and the cuBLAS call."""
    key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, a.dtype.char,
           b.dtype.char, out.dtype.char, transpose_a, transpose_b, exact, tf32_enabled(), alpha,
           accumulate)
    plans = _PLANS.get(key)
    if plans is None:
        if len(_PLANS) >= _MAX_PLANS:                      # many shapes (inference): start over
            _PLANS.clear()
        plans = _PLANS[key] = _plan(a, b, out, transpose_a, transpose_b, exact, alpha,
                                    accumulate)
    if plans is _NOTHING:                                  # nothing to sum: cuBLAS is not asked
        if not accumulate:
            out.fill(0)
        return out
    xp = array_module(out)
    for plan in plans:
        cublas.gemm_strided_batched(
            xp, *plan.sizes, plan.alpha, b.data.ptr + plan.at[1], *plan.b,
            a.data.ptr + plan.at[0], *plan.a, plan.beta, out.data.ptr + plan.at[2], *plan.c,
            *plan.compute)
    return out


class _Plan:
    """cuBLAS's arguments for one call, all but the handle and the three addresses:
    sizes (op_b, op_a, N, M, K), the scalars' host addresses, each operand's (type, leading
    dimension, stride between matrices), compute (count, compute type, algorithm); `at`:
    the bytes from a's, b's and out's first elements to the call's (a part of a split
    product)."""
    __slots__ = ("sizes", "alpha", "b", "a", "beta", "c", "compute", "at")

    def __init__(self, sizes, alpha, b, a, beta, c, compute, at=(0, 0, 0)):
        self.sizes, self.alpha, self.b, self.a = sizes, alpha, b, a
        self.beta, self.c, self.compute, self.at = beta, c, compute, at


_PLANS = {}                  # layout (shapes, strides, dtypes, flags) -> its _Plans, in order
_MAX_PLANS = 4096
_NOTHING = object()          # the plan of an empty product
_SCALARS = {}                # (dtype, value) -> a host scalar cuBLAS reads alpha or beta from


def _plan(a, b, out, transpose_a, transpose_b, exact, alpha, accumulate):
    """Check a layout once and work out cuBLAS's arguments for it -> its _Plans, one per
    call (or _NOTHING for an empty product). Raises ValueError for what cuBLAS cannot read."""
    M, N = out.shape[-2:]
    K = a.shape[-2] if transpose_a else a.shape[-1]
    if (a.shape[-1] if transpose_a else a.shape[-2]) != M or \
            (b.shape[-2] if transpose_b else b.shape[-1]) != N or \
            (b.shape[-1] if transpose_b else b.shape[-2]) != K:
        raise ValueError(f"gemm: op(a) {a.shape} @ op(b) {b.shape} -> out {out.shape} do not fit "
                         f"(transpose_a={transpose_a}, transpose_b={transpose_b})")
    if a.dtype != b.dtype or out.dtype not in (a.dtype, numpy.dtype(numpy.float32)):
        raise ValueError(f"gemm: operands {a.dtype}, {b.dtype} into out {out.dtype}")
    if out.size == 0 or K == 0:
        return _NOTHING
    (count, stride_a), (_, stride_b), (_, stride_c) = (
        _stack_layout(x, count=out.size // (M * N)) for x in (a, b, out))
    if a.dtype == numpy.float64:
        compute, scalar = cublas.COMPUTE_64F, numpy.float64
    elif a.dtype == numpy.float32 and tf32_enabled() and not exact:
        compute, scalar = cublas.COMPUTE_32F_FAST_TF32, numpy.float32
    else:                                   # float16 operands: tensor cores, float32 sums
        compute, scalar = cublas.COMPUTE_32F, numpy.float32
    op = {False: cublas.OP_N, True: cublas.OP_T}
    lds = (_row_stride(a), _row_stride(b), _row_stride(out))

    def part(M, N, K, at=(0, 0, 0), accumulate=accumulate):
        return _Plan((op[transpose_b], op[transpose_a], N, M, K), _scalar(scalar, alpha),
                     (_CUDA_TYPE[b.dtype.char], lds[1], stride_b),
                     (_CUDA_TYPE[a.dtype.char], lds[0], stride_a),
                     _scalar(scalar, 1.0 if accumulate else 0.0),
                     (_CUDA_TYPE[out.dtype.char], lds[2], stride_c),
                     (count, compute, cublas.GEMM_DEFAULT), at)

    split = _split_wide(M, N, K, transpose_a, transpose_b, lds, a.dtype, count)
    if split is None:
        return (part(M, N, K),)
    extent, head = split
    item_a, item_b, item_c = a.itemsize, b.itemsize, out.itemsize
    if extent == "N":                       # out's columns: b's columns (rows if transposed)
        tail_b = head * (lds[1] if transpose_b else 1) * item_b
        return part(M, head, K), part(M, N - head, K, (0, tail_b, head * item_c))
    if extent == "M":                       # out's rows: a's columns (a transposed)
        return part(head, N, K), part(M - head, N, K, (head * item_a, 0, head * lds[2] * item_c))
    # K, the sum's: the tail first, then the head summed into it (beta 1), so that a float16
    # out is rounded once more only by the tail's few terms
    tail_a = head * (lds[0] if transpose_a else 1) * item_a
    tail_b = head * (1 if transpose_b else lds[1]) * item_b
    return part(M, N, K - head, (tail_a, tail_b, 0)), part(M, N, head, accumulate=True)


# A product whose extent along some operand's adjacent elements (out's columns, a's or b's
# row length) is not a multiple of a 16-byte load runs on cuBLAS's narrow-load kernels
# (align1 or align2: CUTLASS's can_implement checks each operand's address, leading dimension
# and that extent; Hopper's TMA kernels need 16-byte row strides): BERT's vocab, 30,522, in
# the MLM decoder's three products. Given leading dimensions of whole loads (the logits' rows
# padded, _output_rows), gemm splits that extent into a head of whole loads, which may run
# vectorized, and a tail of the last few entries (30,522 = 30,520 + 2).
WIDE = 1024                  # an extent from which a split pays for its second call
VECTOR_BYTES = 16


def _split_wide(M, N, K, transpose_a, transpose_b, lds, dtype, count):
    """-> ("M" | "N" | "K", the head's length) for one product (not a stack) of float16,
    float32 or float64 whose one misaligned adjacent extent is at least WIDE long while all
    three leading dimensions are whole loads; else None (nothing to gain)."""
    vector = VECTOR_BYTES // dtype.itemsize
    adjacent = {"N": N, "K": K} if not transpose_a else {"N": N, "M": M}
    if transpose_b:
        adjacent["K"] = K
    misaligned = [name for name, extent in adjacent.items() if extent % vector]
    if count != 1 or len(misaligned) != 1 or any(ld % vector for ld in lds):
        return None
    extent = {"M": M, "N": N, "K": K}[misaligned[0]]
    return (misaligned[0], extent - extent % vector) if extent >= WIDE else None


def _scalar(dtype, value):
    """The host address of a scalar that lives as long as the process (cuBLAS reads alpha
    and beta from host memory at the call)."""
    key = (dtype, value)
    if key not in _SCALARS:
        _SCALARS[key] = numpy.full((), value, dtype)
    return _SCALARS[key].ctypes.data


# cudaDataType_t (CUDA's library_types.h, as cupy.cuda.runtime.CUDA_R_*)
_CUDA_TYPE = {"e": 2, "f": 0, "d": 1}


def _row_stride(x):
    """The distance between a matrix's rows in elements (cuBLAS's leading dimension); its
    elements must be adjacent (one row: any distance will do; one column, as a ones column
    [n, 1]: its rows' distance, whatever its last stride)."""
    if x.shape[-2] == 1 and x.strides[-1] == x.itemsize:
        return x.shape[-1]
    if x.shape[-1] == 1 and x.strides[-2] > 0 and x.strides[-2] % x.itemsize == 0:
        return x.strides[-2] // x.itemsize
    if x.strides[-1] != x.itemsize or x.strides[-2] % x.itemsize \
            or x.strides[-2] // x.itemsize < x.shape[-1]:
        raise ValueError(f"gemm: a matrix of shape {x.shape[-2:]} with strides {x.strides[-2:]}: "
                         f"cuBLAS needs adjacent elements in a row, rows at least a row apart")
    return x.strides[-2] // x.itemsize


def _stack_layout(x, count):
    """-> (count, stride in elements between consecutive matrices) of a stack [S..., r, c]
    whose matrices are equally spaced (or one matrix: stride 0); broadcasting is refused."""
    batch = [(n, s) for n, s in zip(x.shape[:-2], x.strides[:-2]) if n != 1]
    total = math.prod(n for n, _ in batch)
    if total != count:
        raise ValueError(f"gemm: a stack of {total} matrices {x.shape} beside {count}")
    for (_, outer), (n, inner) in zip(batch, batch[1:]):
        if outer != n * inner:
            raise ValueError(f"gemm: stack {x.shape} with strides {x.strides}: its matrices "
                             f"are not equally spaced")
    return count, (batch[-1][1] // x.itemsize if batch else 0)


# Ones to multiply by: column and row sums are products with them. One vector per dtype
# (grown to a power of two), and one cached view of it per length and orientation, so a
# sum makes no CuPy view (a few us of host time each).
_ONES = {}                   # (namespace, dtype char) -> a ones vector
_ONES_VIEWS = {}             # (namespace, dtype char, length, as a column) -> its view


def _ones(xp, dtype, n, column):
    """ones [1, n] (column: [n, 1]) of dtype on xp."""
    key = (xp, dtype.char, n, column)
    view = _ONES_VIEWS.get(key)
    if view is None:
        if len(_ONES_VIEWS) >= _MAX_PLANS:                 # many lengths (inference): start over
            _ONES_VIEWS.clear()
        ones = _ONES.get(key[:2])
        if ones is None or ones.size < n:
            ones = _ONES[key[:2]] = xp.ones(1 << max(n - 1, 1).bit_length(), dtype)
        view = _ONES_VIEWS[key] = ones[:n, None] if column else ones[None, :n]
    return view


def column_sum(x, out=None, dtype=None):
    """x [N, H] summed over its rows -> [H] (into out if given; float16 x into a float32
    out), as ones [1, N] @ x: cuBLAS reads x at full bandwidth. CuPy's x.sum(axis=0) cannot
    use CUB for a reduced axis that is not the last and launches ~24 blocks for 768 sums:
    360 us a call on an H200 at B=128 (105 calls, 37.6 ms of a 129 ms step; torch: 3.1 ms).
    These products take 35-79 us a call there (cuBLAS's gemv kernels: 4.3 ms a step with
    LayerNorm's row means, which the row kernels have since taken over). Never TF32: a
    gradient keeps float32's precision; float64 stays float64."""
    xp = array_module(x)
    N, H = x.shape
    if out is None:
        out = xp.empty(H, dtype=dtype or x.dtype)
    gemm(_ones(xp, x.dtype, N, column=False), x, out.reshape(1, H), exact=True)
    return out


def matmul(a, b, out=None):
    """a @ b (into out if given). Matrices whose rows or columns are adjacent (a transpose
    is an op flag) go to gemm: one cuBLAS call without cupy.matmul's checks. float16 gives
    a float16 product, also when `out` is a float32 weight gradient (then cast into it, as
    apex's O2 does and the NumPy path: a float16 overflow there is what the loss scaler
    must see; gemm could write the float32 sum directly, which would hide it)."""
    xp = array_module(a)
    if out is not None and out.dtype != a.dtype:           # float16 product, float32 buffer
        out[...] = matmul(a, b)
        return out
    if a.ndim == b.ndim == 2 and (out is None or out.strides[-1] == out.itemsize):
        (a_rows, transpose_a), (b_rows, transpose_b) = _as_rows(a), _as_rows(b)
        if a_rows is not None and b_rows is not None:
            if out is None:
                out = xp.empty((a.shape[0], b.shape[1]), a.dtype)
            return gemm(a_rows, b_rows, out, transpose_a, transpose_b)
    return xp.matmul(a, b, out=out)


def _as_rows(x):
    """-> (a matrix with adjacent elements in each row, whether it is x's transpose), or
    (None, False) when neither x nor x.T has them."""
    if x.strides[-1] == x.itemsize:
        return x, False
    if x.strides[-2] == x.itemsize:
        return x.T, True
    return None, False

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """ops.linear_forward in two cuBLAS calls: x @ weight^T (the transpose an op flag), then
    the bias summed into it as the rank-1 product ones [N, 1] @ bias [1, out] (beta = 1: each
    element rounded once, as by an add). Measured on an H200 at B=128 (bench.gpu_host --adds):
    cuBLAS reads and writes [16384, 3072] in 139 us (float16 122), CuPy's broadcasting add in
    248 (float16 248: its elementwise kernels are bound by the element count, not the
    bytes). A wide output whose width is not a multiple of a 16-byte load (the MLM decoder's
    vocab) comes back as a view of padded rows (_output_rows)."""
    xp = array_module(x)
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    out = _output_rows(xp, x2.shape[0], weight.shape[0], x.dtype)     # [N, out]
    if x2.strides[-1] != x2.itemsize or weight.strides[-1] != weight.itemsize:
        matmul(x2, weight.T, out=out)                      # rows not adjacent: a view's copy
    else:
        gemm(x2, weight, out, transpose_b=True)
    gemm(_ones(xp, out.dtype, out.shape[0], column=True), bias.reshape(1, -1), out, exact=True,
         accumulate=True)
    return out.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


# The MLM decoder's logits [M, V] are the step's largest array, and V = 30,522 is no multiple
# of a 16-byte load: rows of V elements would keep all three of its products (the logits,
# dx = dlogits W, dW = dlogits^T x) on cuBLAS's narrow-load kernels. So a wide output's rows are
# padded to a multiple of ROW_PAD elements (30,528): the padding is never read (the
# cross-entropy's kernels and gemm's split products stop at column V), the callers see
# [M, V] (a view), and weights, gradients and checkpoints keep V rows. The loss's gradient is
# laid out as its logits, its padding written as 0 (cross_entropy_backward), and so is its
# float16 copy (cast).
ROW_PAD = 64


def _output_rows(xp, rows, columns, dtype):
    """An empty [rows, columns] of dtype for a product's output: a view of rows padded to a
    multiple of ROW_PAD elements when columns is at least WIDE and not a multiple of a 16-byte
    load, else a plain array."""
    if columns < WIDE or columns % (VECTOR_BYTES // numpy.dtype(dtype).itemsize) == 0:
        return xp.empty((rows, columns), dtype)
    return _empty_rows(xp, (rows, columns), dtype, -(-columns // ROW_PAD) * ROW_PAD)


def _empty_rows(xp, shape, dtype, row_length):
    """An empty [rows, columns] of dtype, each row row_length >= columns elements after the
    previous one: a view of [rows, row_length] (a plain array when they are equal)."""
    if row_length == shape[1]:
        return xp.empty(shape, dtype)
    return xp.empty((shape[0], row_length), dtype)[:, :shape[1]]


def _padded_rows(x):
    """Whether x is a matrix of adjacent elements whose rows lie further apart than their
    length (_output_rows' padding): its row length in elements, else 0."""
    if x.ndim != 2 or x.shape[0] < 2 or x.strides[1] != x.itemsize or x.strides[0] % x.itemsize:
        return 0
    row_length = x.strides[0] // x.itemsize
    return row_length if row_length > x.shape[1] else 0


def cast(x, dtype):
    """x.astype(dtype); a matrix of padded rows (_empty_rows') cast whole, its padding too
    (never read; dlogits' is 0), and viewed as x: the products that read the copy stay
    aligned (CuPy's astype of the view would pack its rows, and a copy into padded rows
    would index each element in two dimensions rather than one)."""
    row_length = _padded_rows(x)
    rows = x.base if row_length else None
    if rows is None or rows.shape != (x.shape[0], row_length) or rows.data.ptr != x.data.ptr:
        return x.astype(dtype)
    return rows.astype(dtype)[:, :x.shape[1]]


# --------------------------------------------------------------------------- CUDA kernels


def _stats_dtype(dtype):
    """float32 for float16 activations (their LayerNorm, softmax and GELU compute in
    float32), else the activations' own."""
    return numpy.dtype(numpy.float32 if dtype == HALF else dtype)


def _launch_rows(name, dtype, rows, *args):
    """The row kernel `name` (kernels.cu) for activations of dtype over `rows` rows."""
    if rows:
        kernels.cuda_kernel(array_module(args[0]), name, dtype)(*_row_grid(rows), args)


def _launch_map(name, dtype, n, *args):
    """The map kernel `name` (kernels.cu) for activations of dtype over n elements."""
    if n:
        kernels.cuda_kernel(array_module(args[0]), name, dtype)(*_map_grid(n, dtype), args)


def _launch_columns(name, dtype, grid_and_block, *args):
    """The column kernel `name` (kernels.cu) on its (grid, block)."""
    (grid,), block = grid_and_block
    if grid:
        kernels.cuda_kernel(array_module(args[0]), name, dtype)((grid,), block, args)


def _column_tiles(rows):
    """The tiles of kernels.BIAS_ROWS rows that cover `rows`."""
    return -(-rows // kernels.BIAS_ROWS)


def _column_tile_grid(rows, columns):
    """(grid, block) of bias_gelu_backward: a block a tile of BIAS_ROWS rows by MAP_THREADS
    columns, a thread a column."""
    return (_column_tiles(rows) * -(-columns // kernels.MAP_THREADS),), (kernels.MAP_THREADS,)


def _partials_grid(columns):
    """(grid, block) of column_partials: a block 32 columns, MAP_THREADS / 32 warps."""
    return (-(-columns // 32),), (kernels.MAP_THREADS,)


def _row_grid(rows):
    """(grid, block) of a row kernel: one warp a row, ROW_WARPS warps a block."""
    return (-(-rows // kernels.ROW_WARPS),), (32 * kernels.ROW_WARPS,)


def _map_grid(n, dtype):
    """(grid, block) of a map kernel over n elements: MAP_BYTES of each activation input a
    thread, MAP_THREADS threads a block."""
    per_block = kernels.MAP_THREADS * (kernels.MAP_BYTES // numpy.dtype(dtype).itemsize)
    return (-(-n // per_block),), (kernels.MAP_THREADS,)


def _keep_scale(dtype, p):
    """1 / (1 - p), dropout's scale, in the activations' dtype (as ops.dropout_forward's
    mask), passed in the statistics' dtype."""
    return _stats_dtype(dtype).type(dtype.type(1.0 / (1.0 - p)))


def _contiguous(x):
    return x if x.flags.c_contiguous else array_module(x).ascontiguousarray(x)


def _unused(xp, dtype):
    """An array that a kernel's switched-off parameter (no mask, no dropout) points at: one
    element of dtype, never read."""
    return _ones(xp, numpy.dtype(dtype), 1, column=False)

# ----------------------------------------------------------------------------- layernorm


def layernorm_forward(x, gamma, beta, eps):
    """ops.layernorm_forward in one kernel (kernels.cu's layernorm_forward, one warp a row:
    the mean, the variance and the output from one read of x). float16 x: statistics and
    xhat in float32, the output in float16, converted in registers (no cast kernel). The
    cache keeps gamma as given (float16 in a float16 run)."""
    xp = array_module(x)
    x = _contiguous(x)
    H = x.shape[-1]
    rows, stats = x.size // H, _stats_dtype(x.dtype)
    xhat, out = xp.empty(x.shape, stats), xp.empty(x.shape, x.dtype)
    rstd = xp.empty(x.shape[:-1] + (1,), stats)
    _launch_rows("layernorm_forward", x.dtype, rows, x, gamma, beta, stats.type(eps),
                 numpy.int64(rows), numpy.int32(H), xhat, out, rstd)
    return out, (xhat, gamma, rstd)


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.layernorm_backward: dx (and dout * xhat, dgamma's summands) in one kernel, one
    warp a row; dgamma and dbeta summed straight into the given buffers (column_sum); float16
    dout and gamma read into float32 arithmetic, dbeta summed in float32, dx written as
    float16: no cast kernel."""
    xp = array_module(dout)
    xhat, gamma, rstd = cache
    dout = _contiguous(dout)
    H = xhat.shape[-1]
    rows = xhat.size // H
    dx, dout_xhat = xp.empty(xhat.shape, dout.dtype), xp.empty(xhat.shape, xhat.dtype)
    _launch_rows("layernorm_backward", dout.dtype, rows, dout, gamma, xhat, rstd,
                 numpy.int64(rows), numpy.int32(H), dx, dout_xhat)
    return (dx, *_layernorm_parameter_grads(dout, dout_xhat, dgamma, dbeta))


def _layernorm_parameter_grads(dout, dout_xhat, dgamma=None, dbeta=None):
    """dgamma and dbeta [H]: the column sums of dout * xhat and dout [..., H] (cuBLAS), in
    the statistics' dtype, into the given buffers."""
    H = dout_xhat.shape[-1]
    return (column_sum(dout_xhat.reshape(-1, H), out=dgamma),
            column_sum(dout.reshape(-1, H), out=dbeta, dtype=dout_xhat.dtype))

# ---------------------------------------------------------------------------------- gelu


def gelu_forward(x, kind="gelu"):
    """ops.gelu_forward: "gelu" in one map kernel; float16 computed in float32 (erf has no
    float16), Phi(x) kept in float32 for the backward, the output rounded to float16 (the
    cache keeps x as it came: no float32 copy). The tanh kinds: the reference, float16 cast
    to float32 and back."""
    xp = array_module(x)
    if kind != "gelu":
        out, cache = ops.gelu_forward(float32_if_half(x), kind)
        return out.astype(x.dtype, copy=False), cache
    x = _contiguous(x)
    out, cdf = xp.empty(x.shape, x.dtype), xp.empty(x.shape, _stats_dtype(x.dtype))
    _launch_map("gelu_forward", x.dtype, x.size, x, numpy.int64(x.size), out, cdf)
    return out, (x, cdf, kind)


def gelu_backward(dout, cache):
    """ops.gelu_backward: "gelu" in one map kernel; float16 dout computed in float32."""
    xp = array_module(dout)
    x, saved, kind = cache
    if kind != "gelu":
        return ops.gelu_backward(float32_if_half(dout), cache).astype(dout.dtype, copy=False)
    dout = _contiguous(dout)
    dx = xp.empty(x.shape, dout.dtype)
    _launch_map("gelu_backward", dout.dtype, x.size, dout, x, saved, numpy.int64(x.size), dx)
    return dx

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x, overwrite_x=False):
    """ops.softmax_forward in one kernel, one warp a row; float16 read as float16 and
    computed in float32, the probabilities written as float16. overwrite_x is NumPy's
    (fast_cpu), ignored here."""
    y = _softmax(x, None, 0.0, None)[0]
    return y, y


def _softmax(scores, mask_bias, dropout_p, rng):
    """The probabilities of scores [..., T] (+ mask_bias [B, 1, 1, T] for scores
    [B, A, T, T], if given), then dropout with probability dropout_p, its keep mask drawn in
    the kernel from rng (a CounterGenerator), in one kernel (kernels.cu's softmax_forward)
    -> (probs, probs after dropout, the DropoutDraw or None: without dropout, (probs, probs,
    None))."""
    xp = array_module(scores)
    scores = _contiguous(scores)
    dtype = scores.dtype
    keys = scores.shape[-1]
    rows = scores.size // keys
    probs = xp.empty(scores.shape, dtype)
    masked = mask_bias is not None
    if masked:
        mask_bias = _contiguous(mask_bias)
        if mask_bias.size * scores.shape[1] * scores.shape[2] != scores.size:
            raise ValueError(f"mask bias {mask_bias.shape} does not fit scores {scores.shape}")
    draw = _draw(rng, dropout_p, scores.shape) if dropout_p > 0.0 else None
    dropped = xp.empty(scores.shape, dtype) if draw is not None else _unused(xp, dtype)
    rows_per_bias = rows // scores.shape[0] if masked else 1
    _launch_rows("softmax_forward", dtype, rows, scores,
                 mask_bias if masked else _unused(xp, dtype), numpy.int32(masked),
                 numpy.int64(rows_per_bias), numpy.int64(rows), numpy.int32(keys),
                 *_draw_arguments(xp, draw, dtype), numpy.int32(draw is not None), probs,
                 dropped)
    return (probs, dropped, draw) if draw is not None else (probs, probs, None)


def softmax_backward(dout, y):
    """ops.softmax_backward in one kernel, one warp a row; float16 computed in float32."""
    return _softmax_backward(dout, None, y)


def _softmax_backward(dprobs, draw, y):
    """dropout_backward (if draw, a DropoutDraw, is given: its keep mask regenerated) then
    softmax_backward of [..., T]: one kernel (kernels.cu's softmax_backward)."""
    xp = array_module(dprobs)
    dprobs = _contiguous(dprobs)
    keys = y.shape[-1]
    rows = y.size // keys
    dscores = xp.empty(y.shape, dprobs.dtype)
    if draw is not None:
        _check_draw("the attention's softmax_backward", draw, dprobs)
    _launch_rows("softmax_backward", dprobs.dtype, rows, dprobs,
                 *_draw_arguments(xp, draw, dprobs.dtype), numpy.int32(draw is not None),
                 _contiguous(y), numpy.int64(rows), numpy.int32(keys), dscores)
    return dscores

# ------------------------------------------------------------------------------- dropout
# Dropout draws its keep mask inside the kernels from a counter-based generator
# (counter_rng.CounterGenerator, Philox in kernels.cu): no uniform buffer, no cuRAND launch,
# no mask stored. The forward's cache is the draw's description (DropoutDraw), from which the
# backward regenerates the same mask.


class DropoutDraw(NamedTuple):
    """One dropout's keep mask as a counter-based draw: the cache the GPU forward keeps in
    place of the mask (ops.AttentionCache.dropout_mask on the attention's path)."""
    seed_lo: numpy.uint32      # Philox's key: the generator's seed
    seed_hi: numpy.uint32
    step: object               # the generator's 0-d uint64 device step, read by the kernels
    call: numpy.uint32         # this draw's call index within the step
    p: float                   # dropout probability; kept where the uniform >= p
    shape: tuple               # the array it masks


def _draw(rng, p, shape):
    """The next dropout draw of rng, a counter_rng.CounterGenerator (counter_rng.default_rng on
    CuPy) -> a DropoutDraw. The step is the device array itself: a backward must run before
    the generator's next begin_step."""
    if not hasattr(rng, "next_call"):
        raise ValueError(f"GPU dropout draws in its kernels from a CounterGenerator "
                         f"(nanobert.model.counter_rng.default_rng(cupy, seed)), not a "
                         f"{type(rng).__name__}")
    if math.prod(shape) > 2 ** 34:
        raise ValueError(f"dropout of {shape}: more than 2^34 elements, the counter's range")
    seed_lo, seed_hi = rng.key
    return DropoutDraw(seed_lo, seed_hi, rng.step, numpy.uint32(rng.next_call()), p,
                       tuple(shape))


def _draw_arguments(xp, draw, dtype):
    """A draw as the dropout kernels take it: step (the device counter), seed words, call,
    p and the keep scale in the statistics' dtype (switched-off values without a draw)."""
    stats = _stats_dtype(dtype)
    if draw is None:
        zero = numpy.uint32(0)
        return _unused(xp, numpy.uint64), zero, zero, zero, stats.type(0), stats.type(1)
    return (draw.step, draw.seed_lo, draw.seed_hi, draw.call, stats.type(draw.p),
            _keep_scale(dtype, draw.p))


def _check_draw(what, draw, dout):
    if not isinstance(draw, DropoutDraw) or draw.shape != dout.shape:
        raise ValueError(f"{what}: its cache should be the forward's DropoutDraw of "
                         f"{dout.shape}, got {draw!r:.120}")


def dropout_forward(x, p, rng, training):
    """ops.dropout_forward: one map kernel that draws the keep mask itself
    -> (out, DropoutDraw)."""
    if not training or p == 0.0:
        return x, None
    return _dropout(x, None, p, rng)


def dropout_add_forward(x, residual, p, rng, training):
    """ops.dropout_add_forward: dropout and add in one map kernel. `residual` is not
    modified."""
    if not training or p == 0.0:
        return x + residual, None
    return _dropout(x, residual, p, rng)


def _dropout(x, residual, p, rng):
    """dropout of x with probability p (+ residual, if given) -> (out, DropoutDraw), one
    map kernel (kernels.cu's dropout)."""
    xp = array_module(x)
    x = _contiguous(x)
    dtype = x.dtype
    added = residual is not None
    if added and residual.shape != x.shape:
        raise ValueError(f"dropout_add_forward: residual {residual.shape} is not shaped like "
                         f"x {x.shape}")
    draw = _draw(rng, p, x.shape)
    out = xp.empty(x.shape, dtype)
    _launch_map("dropout", dtype, x.size, x, *_draw_arguments(xp, draw, dtype),
                numpy.int32(added), _contiguous(residual) if added else _unused(xp, dtype),
                numpy.int64(x.size), out)
    return out, draw


def dropout_backward(dout, draw):
    """ops.dropout_backward: dout times the forward's keep mask, regenerated from its
    DropoutDraw, in one map kernel (dout itself without a draw)."""
    if draw is None:
        return dout
    xp = array_module(dout)
    dout = _contiguous(dout)
    _check_draw("dropout_backward", draw, dout)
    dx = xp.empty(dout.shape, dout.dtype)
    _launch_map("dropout_backward", dout.dtype, dout.size, dout,
                *_draw_arguments(xp, draw, dout.dtype), numpy.int64(dout.size), dx)
    return dx


def uniform(step, key, call, shape, dtype):
    """The uniforms in [0, 1) of one counter-based draw (CounterGenerator.random: the device
    step, the key's two words, the call index) -> a [shape] array of dtype (float32 or
    float64), one map kernel (kernels.cu's uniform)."""
    xp = array_module(step)
    out = xp.empty(shape, dtype)
    _launch_map("uniform", dtype, out.size, step, *key, numpy.uint32(call),
                numpy.int64(out.size), out)
    return out

# ---------------------------------------------------------------------- self-attention


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training):
    """ops.self_attention_forward: one kernel (kernels.cu's attention_heads) adds
    the projection's bias, scales q and writes q, k and v as contiguous heads [B, A, T, D]
    (the stacked projection's heads are not equally spaced, so cuBLAS cannot read them in
    place). Then, where _fused_attention allows, one fused kernel (_fused_attention_forward);
    else the products are gemm calls (k^T an op flag, no copy) around the softmax kernel, and
    one kernel (move_heads) brings the context back to [B, T, H]. Same math as the NumPy path
    in the same order."""
    xp = array_module(x)
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    dtype = x.dtype
    x2 = x.reshape(-1, H)                                  # [N, H]
    qkv = _contiguous(matmul(x2, w_qkv.T))                 # [N, 3H], no bias yet
    q, k, v = (xp.empty((B, A, T, D), dtype=dtype) for _ in range(3))
    _launch_map("attention_heads", dtype, q.size, qkv, _contiguous(b_qkv),
                _head_scale(dtype, D), *_head_shape(A, T, D), numpy.int64(q.size), q, k, v)
    dropout_p = dropout_p if training else 0.0
    if _fused_attention(dtype, D):
        return _fused_attention_forward((x2, w_qkv, x.shape), q, k, v, mask_bias, dropout_p,
                                        rng)
    scores = gemm(q, k, xp.empty((B, A, T, T), dtype), transpose_b=True)  # q k^T
    probs, probs_dropped, dropout_cache = _softmax(scores, mask_bias, dropout_p, rng)
    heads = gemm(probs_dropped, v, xp.empty((B, A, T, D), dtype))
    context = xp.empty((B, T, H), dtype)
    _launch_map("move_heads", dtype, heads.size, heads, numpy.int32(1), *_head_shape(A, T, D),
                numpy.int64(heads.size), context)
    cache = AttentionCache(qkv=(x2, w_qkv, x.shape), q=q, k=k, v=v, probs=probs,
                           probs_dropped=probs_dropped, dropout_mask=dropout_cache, num_heads=A)
    return context, cache


def self_attention_dqkv(dcontext, cache):
    """ops.self_attention_backward up to the projection's gradient dqkv [B, T, 3H] (fast.py
    then runs linear_backward): the products are gemm calls with transposes as op flags;
    one kernel (kernels.cu's attention_grads) scales dq and writes dq, dk, dv into
    the stacked projection's layout. One kernel (move_heads) brings dcontext into
    contiguous heads. A FusedAttentionCache: _fused_attention_dqkv."""
    if isinstance(cache, FusedAttentionCache):
        return _fused_attention_dqkv(dcontext, cache)
    xp = array_module(dcontext)
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dtype = dcontext.dtype
    rows, dcontext = _contiguous(dcontext), xp.empty((B, A, T, D), dtype)
    _launch_map("move_heads", dtype, rows.size, rows, numpy.int32(0), *_head_shape(A, T, D),
                numpy.int64(rows.size), dcontext)
    dv = gemm(cache.probs_dropped, dcontext, xp.empty((B, A, T, D), dtype), transpose_a=True)
    dprobs = gemm(dcontext, cache.v, xp.empty((B, A, T, T), dtype), transpose_b=True)
    # dropout_backward then softmax_backward (float16: dropout in float16, softmax in
    # float32, as the reference), one kernel
    dscores = _softmax_backward(dprobs, cache.dropout_mask, cache.probs)   # [B, A, T, T]
    dq = gemm(dscores, cache.k, xp.empty((B, A, T, D), dtype))  # dq / scale
    dk = gemm(dscores, cache.q, xp.empty((B, A, T, D), dtype), transpose_a=True)
    dqkv = xp.empty((B, T, 3 * H), dtype=dtype)
    _launch_map("attention_grads", dtype, dq.size, dq, dk, dv, _head_scale(dtype, D),
                *_head_shape(A, T, D), numpy.int64(dq.size), dqkv)
    return dqkv


def _head_shape(A, T, D):
    """The heads' shape as the head kernels take it: heads, positions, head size."""
    return numpy.int32(A), numpy.int32(T), numpy.int32(D)


def _head_scale(dtype, D):
    """1 / sqrt(D), q's scaling, in the activations' dtype, passed in the statistics'."""
    return _stats_dtype(dtype).type(dtype.type(1.0 / math.sqrt(D)))

# The fused attention (kernels.cu's attention_forward, attention_backward_queries and
# attention_backward_keys: FlashAttention-2's tiles and online softmax): the scores,
# probabilities and dropout masks [B, A, T, T] are never written; the cache keeps q, k, v,
# the context and each row's log-sum-exp, O(B A T D). float16 on a GPU of sm_80 or later
# runs their tensor-core twins (the _mma kernels: mma.sync), float32 (and float16 before
# sm_80) the SIMT kernels, float64 the unfused kernels always (the float64 = NumPy path), and
# so do heads larger than kernels.ATTENTION_HEAD_MAX. $NANOBERT_FUSED_ATTENTION picks the
# dtypes: 0 none, float16, or 1 (float16 and float32). Default 0: neither has run on a GPU
# yet (kernels.cu's estimates: the tensor-core kernels ~4-5 ms faster a float16 step at
# T=128 B=128, ~20 ms at T=512 B=32; the SIMT ones even at T=128 in TF32, slower at T=512).
# Read at import, as backend.tf32_enabled.
FUSED_ATTENTION_DTYPES = {"0": (), "float16": (numpy.float16,),
                          "1": (numpy.float16, numpy.float32)}


def _read_fused_attention():
    """$NANOBERT_FUSED_ATTENTION -> the dtypes whose attention runs fused."""
    told = os.environ.get("NANOBERT_FUSED_ATTENTION", "0")
    if told not in FUSED_ATTENTION_DTYPES:
        raise ValueError(f"NANOBERT_FUSED_ATTENTION must be one of "
                         f"{', '.join(FUSED_ATTENTION_DTYPES)}, got {told!r}")
    return frozenset(numpy.dtype(d) for d in FUSED_ATTENTION_DTYPES[told])


FUSED_ATTENTION = _read_fused_attention()
_TENSOR_CORES = {}           # namespace -> whether its GPU runs mma.sync m16n8k16 (sm_80+)


def _fused_attention(dtype, head_size):
    """Whether attention of these activations and head size runs the fused kernels."""
    return dtype in FUSED_ATTENTION and head_size <= kernels.ATTENTION_HEAD_MAX


def _tensor_cores(xp):
    """Whether the device of namespace xp has float16 mma.sync m16n8k16 (sm_80 and later),
    asked once."""
    if xp not in _TENSOR_CORES:
        _TENSOR_CORES[xp] = int(xp.cuda.Device().compute_capability) >= 80
    return _TENSOR_CORES[xp]


class FusedAttentionCache(NamedTuple):
    """The fused attention's cache: what its backward recomputes the probabilities from."""
    qkv: tuple                 # linear cache of the stacked projection
    q: object                  # [B, A, T, D], already scaled by 1/sqrt(D)
    k: object                  # [B, A, T, D]
    v: object                  # [B, A, T, D]
    mask_bias: object          # [B, 1, 1, T] or None
    context: object            # [B, T, H], the forward's output (O of D_i = dO_i . O_i)
    lse: object                # [B, A, T] statistics' dtype: each row's log-sum-exp
    dropout_mask: object       # DropoutDraw or None: the mask regenerated from it
    num_heads: int

    @property
    def probs(self):
        """The softmax before dropout [B, A, T, T] (output_attentions): recomputed on request
        by the unfused kernels (q k^T, then the softmax kernel), never kept."""
        q, k = self.q, self.k
        scores = gemm(q, k, array_module(q).empty(q.shape[:3] + k.shape[2:3], q.dtype),
                      transpose_b=True)
        return _softmax(scores, self.mask_bias, 0.0, None)[0]


def _fused_attention_forward(qkv_cache, q, k, v, mask_bias, dropout_p, rng):
    """The attention from the heads q, k, v [B, A, T, D] on: one kernel (kernels.cu's
    attention_forward) -> (context [B, T, H], FusedAttentionCache). Dropout draws from rng
    the draw the unfused softmax kernel would (the same call index, the same masks)."""
    xp = array_module(q)
    B, A, T, D = q.shape
    dtype = q.dtype
    draw = _draw(rng, dropout_p, (B, A, T, T)) if dropout_p > 0.0 else None
    context = xp.empty((B, T, A * D), dtype)
    lse = xp.empty((B, A, T), _stats_dtype(dtype))
    _launch_attention("attention_forward", dtype, B * A, T, q, k, v,
                      *_mask_arguments(xp, mask_bias, B, T, dtype), *_head_shape(A, T, D),
                      *_draw_arguments(xp, draw, dtype), numpy.int32(draw is not None),
                      context, lse)
    return context, FusedAttentionCache(qkv=qkv_cache, q=q, k=k, v=v, mask_bias=mask_bias,
                                        context=context, lse=lse, dropout_mask=draw, num_heads=A)


def _fused_attention_dqkv(dcontext, cache):
    """self_attention_dqkv of a FusedAttentionCache: two kernels (kernels.cu's
    attention_backward_queries, then attention_backward_keys, which reads the first's D_i)
    read dcontext [B, T, H] in place and write dqkv [B, T, 3H]: no move_heads, no
    attention_grads, no [B, A, T, T] array."""
    xp = array_module(dcontext)
    q = cache.q
    B, A, T, D = q.shape
    dtype = q.dtype
    if dcontext.shape != (B, T, A * D) or dcontext.dtype != dtype:
        raise ValueError(f"self_attention_backward: dcontext {dcontext.shape} {dcontext.dtype} "
                         f"does not fit the fused attention's {(B, T, A * D)} {dtype}")
    draw = cache.dropout_mask
    if draw is not None and (not isinstance(draw, DropoutDraw) or draw.shape != (B, A, T, T)):
        raise ValueError(f"self_attention_backward: the fused cache's draw should be a "
                         f"DropoutDraw of {(B, A, T, T)}, got {draw!r:.120}")
    dcontext = _contiguous(dcontext)
    delta = xp.empty((B, A, T), cache.lse.dtype)           # D_i = dO_i . O_i
    dqkv = xp.empty((B, T, 3 * A * D), dtype)
    heads = (q, cache.k, cache.v, *_mask_arguments(xp, cache.mask_bias, B, T, dtype),
             *_head_shape(A, T, D))
    dropout = (*_draw_arguments(xp, draw, dtype), numpy.int32(draw is not None))
    _launch_attention("attention_backward_queries", dtype, B * A, T, *heads, cache.context,
                      dcontext, cache.lse, *dropout, _head_scale(dtype, D), delta, dqkv)
    _launch_attention("attention_backward_keys", dtype, B * A, T, *heads, dcontext,
                      cache.lse, delta, *dropout, dqkv)
    return dqkv


def _mask_arguments(xp, mask_bias, B, T, dtype):
    """The mask bias [B, 1, 1, T] as the fused kernels take it: (bias, masked) (None: an
    unused array, 0)."""
    if mask_bias is None:
        return _unused(xp, dtype), numpy.int32(0)
    if mask_bias.size != B * T or mask_bias.dtype != dtype:
        raise ValueError(f"mask bias {mask_bias.shape} {mask_bias.dtype} does not fit the "
                         f"attention's [B, 1, 1, T] = {(B, 1, 1, T)} {dtype}")
    return _contiguous(mask_bias), numpy.int32(1)


def _launch_attention(name, dtype, heads, T, *args):
    """The fused attention kernel `name` over `heads` (batch, head) pairs of T positions;
    float16 on tensor cores: its twin name + kernels.ATTENTION_MMA (the same arguments)."""
    if heads and T:
        xp = array_module(args[0])
        if dtype == HALF and _tensor_cores(xp):
            name += kernels.ATTENTION_MMA
        kernels.cuda_kernel(xp, name, dtype)(*_attention_grid(heads, T), args)


def _attention_grid(heads, T):
    """(grid, block) of a fused attention kernel: ATTENTION_ROWS rows a block, two threads a
    row."""
    return (heads * -(-T // kernels.ATTENTION_ROWS),), (2 * kernels.ATTENTION_ROWS,)


# ------------------------------------------------------------------------- cross-entropy


class CrossEntropyCache(NamedTuple):
    """What the CUDA cross-entropy's backward needs: the logits themselves (it recomputes the
    softmax), not an [N, C] buffer of the forward's."""
    logits: object             # [N, C], as given
    labels: object             # [N] int64, -100 where not counted
    row_max: object            # [N] statistics' dtype
    sum_exp: object            # [N] sum of exp(logits - row max)
    count: int                 # how many rows the loss counts
    denominator: float         # what their summed loss is divided by


def cross_entropy_forward(logits, labels, denominator=None, count=None):
    """ops.cross_entropy_forward in one row kernel (kernels.cu's cross_entropy_forward: the
    row max, the sum of exponentials and -log p(label) from two reads of each row; float16
    logits read into float32) and the sum of its [N] losses; the loss stays on the device,
    and `count` comes from the caller's host labels (else it is read from the device).
    Logits of padded rows (the MLM decoder's, _output_rows) are read in place, their padding
    never."""
    xp = array_module(logits)
    if count is None and denominator is None:
        count = int((labels != ops.IGNORE_INDEX).sum())     # a host wait
    logits, row_length = _rows_in_place(logits)
    labels = _contiguous(labels.astype(numpy.int64, copy=False))
    N, C = logits.shape
    stats = _stats_dtype(logits.dtype)
    row_max, sum_exp, nll = (xp.empty(N, stats) for _ in range(3))
    _launch_rows("cross_entropy_forward", logits.dtype, N, logits, labels, numpy.int64(N),
                 numpy.int32(C), numpy.int64(row_length), row_max, sum_exp, nll)
    if denominator is None:
        denominator = max(count, 1)
    elif isinstance(denominator, xp.ndarray):   # a device count: the loss stays in stats
        denominator = denominator.astype(stats, copy=False)
    return (nll.sum() / denominator,
            CrossEntropyCache(logits, labels, row_max, sum_exp, count, denominator))


def _rows_in_place(x):
    """-> (x, its row length in elements) for a matrix of padded rows, else (x contiguous,
    its row length)."""
    row_length = _padded_rows(x)
    if row_length:
        return x, row_length
    x = _contiguous(x)
    return x, x.shape[-1]


def cross_entropy_backward(dloss, cache):
    """ops.cross_entropy_backward in one row kernel (kernels.cu's cross_entropy_backward:
    the softmax recomputed from the forward's row statistics, minus the one-hot, times
    dloss / denominator) -> dlogits [N, C] in the statistics' dtype, its rows laid out as
    the logits' (padded rows, the padding 0: the products it feeds stay aligned). dloss: a
    number, or a 0-d device array (a loss scale: never read by the host)."""
    xp = array_module(cache.logits)
    N, C = cache.logits.shape
    row_length = _padded_rows(cache.logits) or C
    stats = cache.row_max.dtype
    if isinstance(dloss, xp.ndarray):
        dloss = dloss.astype(stats, copy=False)
    else:
        dloss = xp.full((), dloss, stats)                   # a fill: no copy from the host
    denominator = cache.denominator
    if isinstance(denominator, xp.ndarray):  # a device count (a graph's step): into dloss
        dloss, denominator = dloss / denominator, 1
    dlogits = _empty_rows(xp, (N, C), stats, row_length)
    _launch_rows("cross_entropy_backward", cache.logits.dtype, N, cache.logits, cache.labels,
                 cache.row_max, cache.sum_exp, dloss, stats.type(denominator),
                 numpy.int64(N), numpy.int32(C), numpy.int64(row_length), dlogits)
    return dlogits

# ----------------------------------------------------------------------------- inference
# What fast.py routes x_forward(..., cache=False) to in eval mode: the *_forward, its cache
# dropped (no in-place trick: CuPy allocates from its pool, and the kernels are the same).


def layernorm_inference(x, gamma, beta, eps, residual=None):
    """LayerNorm(x + residual): the Add & Norm kernel without dropout (the sum never in
    memory)."""
    if residual is None:
        return layernorm_forward(x, gamma, beta, eps)[0]
    return dropout_add_layernorm_forward(x, residual, gamma, beta, eps, 0.0, None, False)[0]


def self_attention_inference(x, w_qkv, b_qkv, mask_bias, num_heads):
    return self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, 0.0, None, False)[0]

# ------------------------------------------------------------------------ composite ops
# ops.py's composites: the up-projection with its GELU as a product and one map kernel (no
# rank-1 product for the bias: an align1 cuBLAS kernel, K = 1); dropout + residual +
# LayerNorm as one row kernel each way.


class BiasGeluCache(NamedTuple):
    """linear_gelu_forward's GELU cache here: the product without its bias, and the bias.
    The backward adds them again in registers and recomputes Phi(x): x = product + bias and
    Phi(x) are never written (ops' cache keeps both, [N, I] each, Phi in float32)."""
    product: object            # [..., I] x W^T
    bias: object               # [I]
    kind: str


def linear_gelu_forward(x, weight, bias, kind="gelu"):
    """ops.linear_gelu_forward: the product (one cuBLAS call, the transpose an op flag),
    then one map kernel (kernels.cu's bias_gelu_forward) that adds the bias and applies
    GELU, float16 computed in float32; the tanh kinds: linear_forward then gelu_forward.
    Reads the product once and writes the output: linear_forward then gelu_forward read it
    three times and write it three times (the bias's product in place, x Phi(x), Phi)."""
    if kind != "gelu":
        y, linear = linear_forward(x, weight, bias)
        out, gelu = gelu_forward(y, kind)
        return out, ops.LinearGeluCache(linear=linear, gelu=gelu)
    xp = array_module(x)
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    product = matmul(x2, weight.T)                         # [N, out], no bias
    out = xp.empty(product.shape, x.dtype)
    _launch_map("bias_gelu_forward", x.dtype, product.size, product, _bias_of(product, bias),
                numpy.int64(product.shape[-1]), numpy.int64(product.size), out)
    shape = (*x.shape[:-1], weight.shape[0])
    return out.reshape(shape), ops.LinearGeluCache(
        linear=(x2, weight, x.shape), gelu=BiasGeluCache(product=product, bias=bias, kind=kind))


def bias_gelu_backward(dout, cache, dbias=None):
    """GELU's backward of linear_gelu_forward's output and the linear's bias gradient
    -> (dx, the gradient of the linear's output [..., out]; dbias [out], into dbias if given,
    else in dout's dtype). One kernel (kernels.cu's bias_gelu_backward) from dout, the product
    and the bias writes dx and each tile's column sums of it, a second (column_partials) adds
    the tiles in order: deterministic, and dx is not read again for dbias (column_sum's
    cuBLAS product read it: [N, out] bytes). The sums differ from column_sum's in their
    order only (float32 for float16 dx, as cuBLAS's). The tanh kinds (an ordinary GELU
    cache): gelu_backward, then column_sum."""
    if not isinstance(cache, BiasGeluCache):
        dx = gelu_backward(dout, cache)
        return dx, column_sum(dx.reshape(-1, dx.shape[-1]), out=dbias)
    xp = array_module(dout)
    dout = _contiguous(dout)
    if dout.size != cache.product.size or dout.dtype != cache.product.dtype:
        raise ValueError(f"bias_gelu_backward: dout {dout.shape} {dout.dtype} does not match "
                         f"the product {cache.product.shape} {cache.product.dtype}")
    product = cache.product
    rows, columns = product.shape
    stats = _stats_dtype(dout.dtype)
    dx = xp.empty(dout.shape, dout.dtype)
    partials = xp.empty((_column_tiles(rows), columns), stats)
    _launch_columns("bias_gelu_backward", dout.dtype, _column_tile_grid(rows, columns), dout,
                    product, _bias_of(product, cache.bias), numpy.int64(rows),
                    numpy.int32(columns), dx, partials)
    into = dbias is not None and dbias.dtype == stats and dbias.flags.c_contiguous
    sums = dbias if into else xp.empty(columns, stats)
    _launch_columns("column_partials", dout.dtype, _partials_grid(columns), partials,
                    numpy.int64(partials.shape[0]), numpy.int64(columns), sums)
    if into:
        return dx, dbias
    if dbias is None:
        return dx, sums.astype(dout.dtype, copy=False)
    dbias[...] = sums
    return dx, dbias


def _bias_of(product, bias):
    """bias [columns], checked against the product [N, columns] it is added to."""
    if bias.shape != product.shape[-1:] or bias.dtype != product.dtype:
        raise ValueError(f"bias {bias.shape} {bias.dtype} does not fit the product "
                         f"{product.shape} {product.dtype}")
    return _contiguous(bias)


def linear_gelu_inference(x, weight, bias, kind="gelu"):
    return linear_gelu_forward(x, weight, bias, kind)[0]


def dropout_add_layernorm_forward(x, residual, gamma, beta, eps, p, rng, training):
    """ops.dropout_add_layernorm_forward in one row kernel (kernels.cu's
    dropout_add_layernorm_forward): dropout (its keep mask drawn in the kernel, as
    dropout_add_forward's), the residual's add and LayerNorm, the sum never in memory; the
    same arithmetic as dropout_add_forward then layernorm_forward, bitwise. The cache: the
    DropoutDraw (None without dropout) and layernorm_forward's."""
    xp = array_module(x)
    x, residual = _contiguous(x), _contiguous(residual)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"dropout_add_layernorm_forward: residual {residual.shape} "
                         f"{residual.dtype} is not shaped and typed like x {x.shape} {x.dtype}")
    dtype, H = x.dtype, x.shape[-1]
    rows, stats = x.size // H, _stats_dtype(dtype)
    draw = _draw(rng, p, x.shape) if training and p != 0.0 else None
    xhat, out = xp.empty(x.shape, stats), xp.empty(x.shape, dtype)
    rstd = xp.empty(x.shape[:-1] + (1,), stats)
    _launch_rows("dropout_add_layernorm_forward", dtype, rows, x, residual,
                 *_draw_arguments(xp, draw, dtype), numpy.int32(draw is not None), gamma, beta,
                 stats.type(eps), numpy.int64(rows), numpy.int32(H), xhat, out, rstd)
    return out, ops.DropoutAddLayerNormCache(dropout_mask=draw, layernorm=(xhat, gamma, rstd))


def dropout_add_layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.dropout_add_layernorm_backward in one row kernel (kernels.cu's
    dropout_add_layernorm_backward: layernorm_backward's dx is dresidual, dropout's multiply
    made on it in registers, the keep mask regenerated), dgamma and dbeta as
    layernorm_backward's: bitwise layernorm_backward then dropout_backward. Without dropout
    dx is dresidual, one array."""
    xp = array_module(dout)
    draw, (xhat, gamma, rstd) = cache.dropout_mask, cache.layernorm
    dout = _contiguous(dout)
    H = xhat.shape[-1]
    rows = xhat.size // H
    if draw is not None:
        _check_draw("dropout_add_layernorm_backward", draw, dout)
    dresidual, dout_xhat = xp.empty(xhat.shape, dout.dtype), xp.empty(xhat.shape, xhat.dtype)
    dx = xp.empty(xhat.shape, dout.dtype) if draw is not None else dresidual
    _launch_rows("dropout_add_layernorm_backward", dout.dtype, rows, dout, gamma, xhat, rstd,
                 numpy.int64(rows), numpy.int32(H), *_draw_arguments(xp, draw, dout.dtype),
                 numpy.int32(draw is not None), dx, dresidual, dout_xhat)
    dgamma, dbeta = _layernorm_parameter_grads(dout, dout_xhat, dgamma, dbeta)
    return dx, dresidual, dgamma, dbeta
