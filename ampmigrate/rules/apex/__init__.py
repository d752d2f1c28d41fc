"""AMP1: NVIDIA apex (apex.amp, apex.fp16_utils, apex.parallel removed in May 2025) -> torch."""
