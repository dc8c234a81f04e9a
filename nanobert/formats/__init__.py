"""Files: safetensors, HF checkpoints, atomic writes, models and data shipped in packages."""
