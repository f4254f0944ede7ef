"""The policy registry is one explicit list: every class that names itself is on it,
once, and importing a policy module registers nothing by itself."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import koi.policies
from koi.policies import Policy, make_policy, policy_class, policy_names


def _named_subclasses() -> set[type[Policy]]:
    for info in pkgutil.iter_modules(koi.policies.__path__):
        importlib.import_module(f"koi.policies.{info.name}")
    seen: set[type[Policy]] = set()
    todo = list(Policy.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo.extend(cls.__subclasses__())
    return {c for c in seen if "name" in vars(c) and c.name}


def test_every_named_policy_class_is_listed_under_its_name() -> None:
    named = _named_subclasses()
    assert named, "no policy class found"
    assert {c.name for c in named} == set(policy_names())
    for cls in named:
        assert policy_class(cls.name) is cls


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"known policies: .*fcfs-first-fit"):
        make_policy("no-such-policy")


def test_base_imports_no_policy_module() -> None:
    import ast
    import inspect

    from koi.policies import base

    tree = ast.parse(inspect.getsource(base))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("koi.policies")}
