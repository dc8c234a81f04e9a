"""How much arithmetic a step is: for the GFLOP/s and MFU that train.py and the benchmark print."""


def step_flops(config, B, T, num_masked):
    """Matmul FLOPs of one training step (3x forward: forward + two backward matmuls)."""
    H, I = config.hidden_size, config.intermediate_size
    L, V = config.num_hidden_layers, config.vocab_size
    per_token = L * (2 * (4 * H * H + 2 * H * I) + 2 * 2 * T * H)   # dense layers + QK^T, PV
    forward = B * T * per_token + num_masked * 2 * (H * H + H * V) + B * 2 * (H * H + 2 * H)
    return 3 * forward
