"""ampmigrate: find and fix legacy PyTorch mixed-precision code.

`check` and `fix` need only libcst, click and rich; `verify` needs torch and lives in
`ampmigrate.verify`, which imports the engine (never the other way round).
"""

__version__ = "0.1.0"
