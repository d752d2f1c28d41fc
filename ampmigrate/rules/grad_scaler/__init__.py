"""AMP3xx: the GradScaler protocol (scale -> backward -> unscale_ -> clip -> step -> update)."""
