"""Data parallelism on existing engines: MPI (mpi4py) starts and coordinates the ranks, and the
gradients are summed by MPI's allreduce on the CPU and by NCCL on GPUs. Nothing here moves
bytes by itself.

    mpiexec -n 4 python train.py ...       # 4 ranks, each a slice of every global batch

`process_group(device)` returns the group this process belongs to. Without a launcher (or
with one rank) it is `SingleProcess`, whose operations do nothing, and mpi4py is never
imported: the launcher is recognised from its environment variables first.

Every group has the same small interface:
    rank, world_size, is_main        who am I (rank 0 alone writes files)
    allreduce_(buffer)               sum a flat array over the ranks, in place
    broadcast_(buffer, root=0)       rank root's array everywhere, in place
    sum(values)                      a short list of host numbers summed over the ranks
    any(flag)                        True on every rank when it is True on one (stop, NaN)
    broadcast_object(value)          a small Python object from rank 0
    barrier()                        wait until every rank is here
    digest(buffer)                   a hash of the array, the same on every rank or an error
"""
import hashlib
import os
import sys

import numpy

from .backend import flat_buffer, to_host

# (rank, size) variables of the launchers: MPICH / Intel MPI (Hydra), Open MPI, PMIx, MVAPICH
LAUNCHER_VARIABLES = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                      ("PMIX_RANK", "PMIX_SIZE"), ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))


def launched_world_size():
    """How many ranks the launcher started (1 when there is none), read from its
    environment so that a single process never imports mpi4py."""
    for _, size in LAUNCHER_VARIABLES:
        if os.environ.get(size, "").isdigit():
            return int(os.environ[size])
    return 1


def process_group(device="cpu"):
    """The group of this process: SingleProcess, MPIGroup (CPU) or NCCLGroup (GPU)."""
    if launched_world_size() <= 1:
        return SingleProcess()
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeError("started by an MPI launcher but mpi4py is missing: "
                           "pip install 'nanobert[mpi]'") from e
    comm = MPI.COMM_WORLD
    if comm.Get_size() <= 1:
        return SingleProcess()
    return NCCLGroup(comm) if device == "gpu" else MPIGroup(comm)


class SingleProcess:
    """One process: every collective is the identity."""
    rank, world_size, is_main = 0, 1, True

    def allreduce_(self, buffer):
        return buffer

    def broadcast_(self, buffer, root=0):
        return buffer

    def sum(self, values):
        return list(values)

    def any(self, flag):
        return bool(flag)

    def broadcast_object(self, value):
        return value

    def digest(self, buffer):
        return _digest(buffer)

    def barrier(self):
        pass

    def describe(self):
        return "1 process"


class MPIGroup:
    """Ranks of an MPI job on host (NumPy) buffers: MPI Allreduce / Bcast in place."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, comm
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.is_main = self.rank == 0

    def allreduce_(self, buffer):
        self.comm.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        return buffer

    def broadcast_(self, buffer, root=0):
        self.comm.Bcast(buffer, root=root)
        return buffer

    def sum(self, values):
        totals = numpy.asarray(values, dtype=numpy.float64).copy()
        self.comm.Allreduce(self.MPI.IN_PLACE, totals, op=self.MPI.SUM)
        return totals.tolist()

    def any(self, flag):
        return bool(self.comm.allreduce(bool(flag), op=self.MPI.LOR))

    def broadcast_object(self, value):
        return self.comm.bcast(value, root=0)

    def digest(self, buffer):
        """The hash of rank 0's buffer; a RuntimeError naming the ranks whose buffer differs
        (data parallelism keeps identical weights: a difference is a bug, never noise)."""
        mine = _digest(buffer)
        every = self.comm.allgather(mine)
        differ = [r for r, d in enumerate(every) if d != every[0]]
        if differ:
            raise RuntimeError(f"the weights of rank(s) {differ} differ from rank 0's "
                               f"({len(differ)} of {self.world_size} ranks out of step)")
        return every[0]

    def barrier(self):
        self.comm.Barrier()

    def describe(self):
        return f"{self.world_size} MPI ranks"


class NCCLGroup(MPIGroup):
    """Ranks with one GPU each: gradients on the device are summed by NCCL (its unique id goes
    from rank 0 to the others over MPI); small host values still travel over MPI.
    Written to the CuPy / NCCL API; not yet run on GPU hardware."""

    def __init__(self, comm):
        super().__init__(comm)
        import cupy
        from cupy.cuda import nccl
        self.cupy, self.nccl = cupy, nccl
        local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK",
                                        os.environ.get("MPI_LOCALRANKID", self.rank)))
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
        unique_id = nccl.get_unique_id() if self.is_main else None
        unique_id = comm.bcast(unique_id, root=0)
        self.communicator = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)

    def _nccl_dtype(self, dtype):
        kinds = {numpy.dtype(numpy.float16): self.nccl.NCCL_FLOAT16,
                 numpy.dtype(numpy.float32): self.nccl.NCCL_FLOAT32,
                 numpy.dtype(numpy.float64): self.nccl.NCCL_FLOAT64}
        return kinds[numpy.dtype(dtype)]

    def allreduce_(self, buffer):
        stream = self.cupy.cuda.get_current_stream().ptr
        self.communicator.allReduce(buffer.data.ptr, buffer.data.ptr, buffer.size,
                                    self._nccl_dtype(buffer.dtype), self.nccl.NCCL_SUM, stream)
        return buffer

    def broadcast_(self, buffer, root=0):
        stream = self.cupy.cuda.get_current_stream().ptr
        self.communicator.bcast(buffer.data.ptr, buffer.size, self._nccl_dtype(buffer.dtype),
                                root, stream)
        return buffer

    def describe(self):
        return f"{self.world_size} MPI ranks, NCCL on the GPUs"


def end_job(code):
    """sys.exit(code); but a rank of an MPI job that fails first prints why and ends every
    rank (MPI Abort): the others would otherwise wait in a collective for ever."""
    if code not in (0, None) and launched_world_size() > 1 and "mpi4py" in sys.modules:
        if isinstance(code, str):
            print(code, file=sys.stderr, flush=True)
        sys.stdout.flush()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
    sys.exit(code)


def allreduce_grads(group, grads):
    """Sum the gradients over the ranks: one call on their flat buffer (tensor by tensor for
    a dict of separate arrays)."""
    if group.world_size == 1:
        return grads
    buffer = flat_buffer(grads)
    for array in ([buffer] if buffer is not None else grads.values()):
        group.allreduce_(array)
    return grads


def rank_slice(rows, group):
    """This rank's share of a global batch: the rank-th of world_size disjoint, contiguous
    slices, as equal as can be (a short last batch of an epoch need not divide evenly)."""
    bounds = numpy.linspace(0, len(rows), group.world_size + 1).round().astype(int)
    return rows[bounds[group.rank]:bounds[group.rank + 1]]


def _digest(buffer):
    """A short hash of an array's bytes (copied to the host when it lives on a GPU)."""
    host = numpy.ascontiguousarray(to_host(buffer))
    return hashlib.sha256(host.view(numpy.uint8)).hexdigest()[:16]
