"""The public API is curated: each public module's `__all__`, listed in docs/api.md."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gen_api():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "scripts" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_api_md_is_current():
    gen = _gen_api()
    expected = gen.api_reference()
    actual = gen.API_MD.read_text() if gen.API_MD.exists() else ""
    assert actual == expected, f"docs/api.md is stale: regenerate it with `{gen.REGENERATE}`"


def test_packages_export_exactly_their_all():
    leaked, missing = [], []
    gen = _gen_api()
    for name in gen.public_modules():
        module = importlib.import_module(name)
        exported = set(gen.exported_names(module))
        missing += [f"{name}.{n}" for n in exported if not hasattr(module, n)]
        if not module.__file__.endswith("__init__.py"):
            continue  # a plain module may import what it uses; only packages re-export
        for attr, obj in vars(module).items():
            if attr.startswith("_") or attr in exported or inspect.ismodule(obj):
                continue
            # An agentax object reachable here but not in __all__ is an internal that leaked.
            if (getattr(obj, "__module__", None) or "").startswith("agentax"):
                leaked.append(f"{name}.{attr}")
    assert missing == [], "names in __all__ that the module does not define"
    assert leaked == [], "add these to __all__ (and docs/api.md) or stop importing them there"
