"""AMP2xx: the deprecated `torch.cuda.amp` / `torch.cpu.amp` API and its `torch.amp` spelling."""
