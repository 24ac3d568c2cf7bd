"""engine.core.hooks: a lower layer's announcement reaches its receiver, and one nobody
connected refuses to fire instead of being dropped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core.hooks import Hook, HookNotConnected


def test_a_hook_calls_its_receiver_and_returns_its_answer() -> None:
    hook: Hook = Hook("test", "tests.test_hooks")
    hook.connect(lambda a, b=0: a + b)
    assert hook.fire(2, b=3) == 5


def test_a_hook_without_receiver_refuses_to_fire_and_names_the_module_to_import() -> None:
    hook: Hook = Hook("test", "some.module")
    with pytest.raises(HookNotConnected, match="some.module"):
        hook.fire()


def test_a_second_receiver_is_refused() -> None:
    hook: Hook = Hook("test", "tests.test_hooks")

    def first() -> None: ...

    hook.connect(first)
    hook.connect(first)  # the same one again (a module imported twice) is harmless
    with pytest.raises(ValueError):
        hook.connect(lambda: None)


@pytest.mark.parametrize("root", ["admin.app", "admin.cli", "engine.fleet"])
def test_every_process_root_connects_the_flows_to_people(root: str) -> None:
    code = (f"import {root}; from engine.people.appointments import appointment_event; "
            "from engine.people.contacts import opted_out_everywhere; "
            "assert appointment_event._receiver is not None and opted_out_everywhere._receiver is not None")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
