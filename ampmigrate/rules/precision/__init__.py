"""AMP4xx: the precision a training run uses (fp16 -> bf16 on Ampere and newer, framework flags, TF32)."""
