"""analysis/unbound.py: reads a fix made possibly unbound (the engine's check before writing)."""

import ast
import textwrap

from ampmigrate.analysis.unbound import introduced, possibly_unbound


HELPERS = "make = prepare = use = run = opt = None\n"  # what the snippets call, bound at the top


def unbound(code: str):
    return possibly_unbound(ast.parse(HELPERS + textwrap.dedent(code)))


def test_a_read_before_the_binding_in_straight_code():
    assert unbound("""
        def train(args):
            prepare(scaler=scaler)
            scaler = make()
    """) == {("train", "scaler")}


def test_a_name_bound_in_one_arm_only():
    assert unbound("""
        def train(args):
            if args.fp16:
                pass
            else:
                amp = None
            use(amp)
    """) == {("train", "amp")}


def test_bound_in_every_arm_or_the_other_arm_leaves():
    assert unbound("""
        def f(a):
            if a:
                x = 1
            elif a is None:
                raise ValueError
            else:
                x = 2
            try:
                from apex import amp
            except ImportError:
                raise SystemExit(1)
            return x, amp
    """) == set()


def test_loops_try_with_and_comprehensions():
    assert unbound("""
        def f(items):
            for item in items:
                last = item
            print(last)                    # the loop may not run
            while True:
                found = 1
                break
            with open("f") as handle:
                data = handle.read()
            squares = [v * v for v in data]
            try:
                value = int(data)
            except ValueError:
                value = 0
            return found, squares, value
    """) == {("f", "last"), ("f", "found")}


def test_globals_nested_functions_methods_and_lambdas():
    assert unbound("""
        counter = 0
        def bump():
            global counter
            counter += 1
        def outer():
            def inner():
                return later           # runs after `later` is bound
            later = 1
            key = lambda: lazy
            lazy = 2
            return inner, key
        class Trainer:
            def step(self):
                if self.fp16:
                    scaler = self.scaler
                scaler.update()
    """) == {("Trainer.step", "scaler")}


def test_introduced_counts_only_what_the_fix_added():
    old = HELPERS + textwrap.dedent("""
        def train(args, data):
            if args.fp16:
                from apex import amp
            for x in data:
                if args.fp16:
                    with amp.scale_loss(x, opt) as s:
                        s.backward()
    """)
    same = old.replace("s.backward()", "s.backward(retain_graph=True)")
    assert introduced(old, same) == []
    broken = old.replace("from apex import amp", "pass").replace(
        "    for x in data:", "    run(scaler)\n    scaler = make()\n    for x in data:"
    )
    assert introduced(old, broken) == [("train", "scaler")]
    assert introduced(old, "def broken(:\n") == []  # the compile check judges that



def test_a_handler_that_exits_leaves():
    assert unbound("""
        import sys
        def f():
            try:
                scaler = make()
            except RuntimeError:
                sys.exit(1)
            try:
                other = make()
            except RuntimeError:
                print("no")
            return scaler, other
    """) == {("f", "other")}


def test_a_read_of_a_name_bound_nowhere_after_the_fix():
    """HatefulMemes' `amp_scale = scaled_loss.item() // loss.item()` after its block: with the
    `with ... as scaled_loss` gone, the name is bound nowhere in the file (a NameError)."""
    old = textwrap.dedent("""
        from apex import amp
        def step(loss, optimizer):
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            return scaled_loss.item() / loss.item(), len(__name__)
    """)
    new = old.replace("from apex import amp\n", "").replace(
        "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n",
        "    scaler.scale(loss).backward()\n",
    ).replace("def step(", "scaler = None\ndef step(")
    assert introduced(old, new) == [("step", "scaled_loss")]
    assert introduced(old, "from x import *\n" + new) == []  # a `*` import may bind anything
