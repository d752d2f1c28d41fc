"""apex set up in a builder that its one caller unpacks (rules/apex/_scaler_access.py
`_return_to`): the builder returns the GradScaler as one more value. Fixture:
AMP101/scaler_returned_to_caller.py; here, the shapes around it that must refuse."""

from __future__ import annotations

from conftest import FIXTURES, check, fix

FIXTURE = (FIXTURES / "AMP101" / "scaler_returned_to_caller.py").read_text(encoding="utf-8")


def _reason(text: str) -> str:
    (finding,) = [f for f in check(text, select=["AMP1"]) if "initialize" in f.message]
    assert finding.fix is None
    assert fix(text, select=["AMP1"]) == text
    return finding.no_fix_reason


def _edited(old: str, new: str) -> str:
    assert old in FIXTURE
    return FIXTURE.replace(old, new)


def test_the_builder_returns_the_scaler():
    fixed = fix(FIXTURE, select=["AMP1"])
    assert "    return render_kwargs, start, optimizer, scaler\n" in fixed
    assert "    render_kwargs, start, optimizer, scaler = create_nerf(args)\n" in fixed


def test_a_return_before_amp_initialize_refuses():
    text = _edited(
        "    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)\n",
        "    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)\n"
        "    if args.dry_run:\n        return {\"network_fn\": model}, 0, optimizer\n",
    )
    assert "`create_nerf()` returns at line 21 other than a tuple of the values unpacked" in _reason(text)


def test_a_second_caller_refuses():
    text = FIXTURE + (
        "\n\ndef evaluate(args):\n    render_kwargs, _, _ = create_nerf(args)\n"
        "    for rays, target in load_batches(args):\n        print(F.mse_loss(render(rays, **render_kwargs), target))\n"
    )
    assert "nor returned to it: `create_nerf()` is used 2 times" in _reason(text)


def test_a_use_before_the_call_refuses():
    text = _edited(
        "    render_kwargs, start, optimizer = create_nerf(args)\n",
        "    print(amp.state_dict())\n    render_kwargs, start, optimizer = create_nerf(args)\n",
    )
    assert "`train()` uses apex.amp before it calls `create_nerf()`" in _reason(text)


def test_a_builder_not_ending_with_its_return_refuses():
    text = _edited(
        "    return render_kwargs, start, optimizer\n",
        "    if render_kwargs:\n        return render_kwargs, start, optimizer\n",
    )
    assert "`create_nerf()` does not end with its `return`" in _reason(text)


def test_a_call_not_unpacked_refuses():
    text = _edited(
        "    render_kwargs, start, optimizer = create_nerf(args)\n",
        "    built = create_nerf(args)\n    render_kwargs, start, optimizer = built\n",
    )
    assert "is not unpacked into names by one assignment" in _reason(text)


def test_a_call_inside_a_block_of_the_caller_refuses():
    text = _edited(
        "    render_kwargs, start, optimizer = create_nerf(args)\n",
        "    if args.nerf:\n        render_kwargs, start, optimizer = create_nerf(args)\n"
        "    else:\n        render_kwargs, start, optimizer = {}, 0, None\n",
    )
    assert "`train()` calls `create_nerf()` inside a block of its own" in _reason(text)
