"""`ampmigrate verify`: run a training script before and after the migration and compare.

The parent side (`command`, `project`, `runner`, `stats`, `report`, `plot`) never imports torch;
the child side (`harness`, `devicemap`, `sandbox`) runs inside each training subprocess.
"""
