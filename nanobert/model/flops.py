"""How much arithmetic a step is, and what a GPU could do at most: for the GFLOP/s and the
model FLOPs utilisation (MFU) that train.py and the benchmark print."""

# Dense peak TFLOP/s by precision (NVIDIA's datasheets; no sparsity), for MFU against the
# precision actually used (backend.matmul_precision). More specific names first: "H100 PCIe"
# must match before "H100" (the SXM part). float64: FP64 tensor cores where there are.
GPU_PEAK_TFLOPS = {
    "H100 PCIe": {"float16": 756.0, "tf32": 378.0, "float32": 51.2, "float64": 51.2},
    "H100": {"float16": 989.4, "tf32": 494.7, "float32": 66.9, "float64": 66.9},
    "H200": {"float16": 989.4, "tf32": 494.7, "float32": 66.9, "float64": 66.9},
    "A100": {"float16": 312.0, "tf32": 156.0, "float32": 19.5, "float64": 19.5},
    "L4": {"float16": 121.0, "tf32": 60.0, "float32": 30.3, "float64": 0.5},
    "A10": {"float16": 125.0, "tf32": 62.5, "float32": 31.2, "float64": 1.0},
    "V100": {"float16": 125.0, "tf32": 15.7, "float32": 15.7, "float64": 7.8},   # no TF32
}


def gpu_peak_tflops(gpu_name, precision):
    """The dense peak of `precision` ("float16", "tf32", "float32", "float64") on the GPU
    whose name contains a key of GPU_PEAK_TFLOPS; None for an unknown GPU."""
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks.get(precision)
    return None


def step_flops(config, B, T, num_masked, lengths=None):
    """Matmul FLOPs of one training step (3x forward: forward + two backward matmuls).
    lengths [B]: the encoder ran packed (model/packing.py), row b on its lengths[b] attended
    tokens; None: on all T positions of every row."""
    H, I = config.hidden_size, config.intermediate_size
    L, V = config.num_hidden_layers, config.vocab_size
    lengths = [T] * B if lengths is None else [int(n) for n in lengths]
    tokens, pairs = sum(lengths), sum(n * n for n in lengths)    # pairs: QK^T's scores
    encoder = L * (2 * (4 * H * H + 2 * H * I) * tokens + 2 * 2 * H * pairs)  # dense; QK^T, PV
    forward = encoder + num_masked * 2 * (H * H + H * V) + B * 2 * (H * H + 2 * H)
    return 3 * forward
