"""The value of a torch version check on every torch >= min-torch (AMP206's fix deletes the
branch it rules out only where this is True or False, never on a guess)."""

import libcst as cst
import pytest

from ampmigrate.analysis.version_outcome import outcome
from ampmigrate.config import Settings
from ampmigrate.engine.context import FileContext

HEADER = (
    "import torch\nfrom packaging import version\nfrom packaging.version import Version\n"
    "from distutils.version import LooseVersion\nfrom elsewhere import FLAG\n"
    "_GE_2_3 = Version(torch.__version__) >= Version('2.3.0')\n"
    "_TWICE = True\n_TWICE = False\n"
)
CASES = [
    ("version.parse(torch.__version__) >= version.parse('2.3.0')", (2, 4), True),
    ("version.parse(torch.__version__) >= version.parse('2.4')", (2, 4), True),
    ("version.parse(torch.__version__) >= version.parse('2.4.1')", (2, 4), None),  # 2.4.0 is not
    ("version.parse(torch.__version__) > version.parse('2.4')", (2, 4), None),
    ("version.parse(torch.__version__) > version.parse('2.3')", (2, 4), True),
    ("Version(torch.__version__) < Version('2.4')", (2, 4), False),
    ("Version('2.3') <= Version(torch.__version__)", (2, 4), True),  # flipped
    ("Version(torch.__version__) >= version.parse('2.3')", (2, 4), None),  # two parsers
    ("LooseVersion(torch.__version__) >= LooseVersion('1.6')", (2, 4), True),
    ("torch.__version__ >= '2.4'", (2, 4), True),  # TorchVersion compares as a version
    ("torch.__version__ >= '2.4'", (2, 3), None),
    ("torch.__version__ <= '2.3'", (2, 4), False),
    ("hasattr(torch.amp, 'custom_fwd')", (2, 4), True),
    ("hasattr(torch.amp, 'custom_fwd')", (2, 3), None),
    ("hasattr(torch, 'amp') and hasattr(torch.amp, 'GradScaler')", (2, 4), True),
    ("hasattr(torch.amp, 'GradScaler') and torch.cuda.is_available()", (2, 4), None),
    ("not hasattr(torch.amp, 'GradScaler')", (2, 4), False),
    ("torch.__version__ < '2.0' or torch.cuda.is_available()", (2, 4), None),
    ("torch.__version__ >= '2.0' or torch.cuda.is_available()", (2, 4), True),
    ("_GE_2_3", (2, 4), True),  # a module-level name bound once
    ("_TWICE", (2, 4), None),
    ("FLAG", (2, 4), None),  # imported: unknown
    ("torch.cuda.is_available()", (2, 4), None),
]


@pytest.mark.parametrize("test, min_torch, expected", CASES)
def test_outcome(test, min_torch, expected):
    text = f"{HEADER}if {test}:\n    pass\n"
    module = cst.parse_module(text)
    ctx = FileContext("x.py", text, module, Settings())
    condition = module.body[-1].test
    assert outcome(ctx.names, condition, min_torch) is expected
