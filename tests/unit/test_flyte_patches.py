"""The private-SDK patches (infra/flyte_patches.py): the installed flyte still has what each relies on,
and each still does what it says."""

from __future__ import annotations

import importlib
import inspect
import types
from functools import lru_cache

import pytest

from infra import flyte_patches
from infra.flyte_patches import PATCHED_INTERNALS, PatchedInternal, internal_changes

PATCHES = ("memoize_dataclass_literal_types", "sync_flyte_connections_normally", "forget_config_file_lookup")


@pytest.mark.parametrize("internal", PATCHED_INTERNALS, ids=lambda internal: f"{internal.module}.{internal.name}")
def test_the_installed_sdk_has_what_each_patch_relies_on(internal: PatchedInternal) -> None:
    changes = internal_changes(internal, importlib.import_module(internal.module))
    assert changes == [], (f"flyte {importlib.import_module('flyte').__version__} changed an internal that "
                           f"{internal.patch} patches: {changes}; see its docstring in infra/flyte_patches.py")


@pytest.mark.parametrize("patch", PATCHES)
def test_each_patch_names_its_internals_and_says_what_why_and_how_to_remove_it(patch: str) -> None:
    assert any(internal.patch == patch for internal in PATCHED_INTERNALS)
    doc = inspect.getdoc(getattr(flyte_patches, patch)) or ""
    assert all(heading in doc for heading in ("What:", "Why:", "Remove:")), patch


def test_the_check_catches_a_renamed_a_resigned_and_a_rekinded_internal() -> None:
    class LocalDB:
        @staticmethod
        def opener(extra: int) -> None: ...

        def plain() -> None: ...

    def get_config_file(c: object) -> None: ...

    fake = types.SimpleNamespace(LocalDB=LocalDB, get_config_file=get_config_file,
                                 memoised=lru_cache(get_config_file))

    def changes(name: str, parameters: tuple[str, ...] = (), kind: str = "function") -> list[str]:
        return internal_changes(PatchedInternal("p", "fake", name, parameters, kind), fake)

    assert changes("LocalDB.gone", kind="staticmethod") == ["fake.LocalDB.gone no longer exists"]
    assert changes("Missing.opener") == ["fake.Missing no longer exists"]
    assert changes("LocalDB.opener", (), "staticmethod") == [
        "fake.LocalDB.opener takes ('extra',), the patch expects ()"]
    assert changes("LocalDB.plain", (), "staticmethod") == ["fake.LocalDB.plain is no longer a staticmethod"]
    assert changes("LocalDB.opener", ("extra",), "coroutine-staticmethod") == [
        "fake.LocalDB.opener is no longer a coroutine function"]
    assert changes("get_config_file", ("c",), "lru_cache") == [
        "fake.get_config_file is no longer memoised (functools.lru_cache)"]
    assert changes("memoised", ("c",), "lru_cache") == []
    assert changes("get_config_file", ("c",)) == []


def test_dataclass_literal_types_are_built_once_and_handed_out_as_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyte.types import TypeEngine, _type_engine

    from settings.train import TrainConfig

    built: list[type] = []
    unwrapped = getattr(_type_engine.DataclassTransformer.get_literal_type, "__wrapped__",
                        _type_engine.DataclassTransformer.get_literal_type)

    def counting(self, t):  # type: ignore[no-untyped-def]
        built.append(t)
        return unwrapped(self, t)

    monkeypatch.setattr(_type_engine.DataclassTransformer, "get_literal_type", counting)
    reference = TypeEngine.to_literal_type(TrainConfig)
    assert built == [TrainConfig]  # without the memo: built on every call
    flyte_patches.memoize_dataclass_literal_types()
    first, second = TypeEngine.to_literal_type(TrainConfig), TypeEngine.to_literal_type(TrainConfig)
    assert first == reference and second == reference
    assert built == [TrainConfig, TrainConfig]  # once more for the memo, then never
    first.metadata.Clear()  # a caller changing its copy changes nobody else's
    assert TypeEngine.to_literal_type(TrainConfig) == reference
    flyte_patches.memoize_dataclass_literal_types()  # idempotent: no second layer
    assert TypeEngine.to_literal_type(TrainConfig) == reference and len(built) == 2


def test_flyte_connections_are_wrapped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyte._persistence._db import LocalDB

    for name in ("_initialize_sync_inner", "_initialize_async"):  # restored after the test
        monkeypatch.setattr(LocalDB, name, inspect.getattr_static(LocalDB, name))
    flyte_patches.sync_flyte_connections_normally()
    wrapped = LocalDB._initialize_sync_inner
    assert getattr(wrapped, "dapo_tuned", False)
    assert inspect.iscoroutinefunction(LocalDB._initialize_async)
    flyte_patches.sync_flyte_connections_normally()  # idempotent: no second layer
    assert LocalDB._initialize_sync_inner is wrapped


def test_the_config_file_lookup_is_forgotten() -> None:
    from flyte.config import _reader

    _reader.get_config_file(None)
    assert _reader.get_config_file.cache_info().currsize >= 1
    flyte_patches.forget_config_file_lookup()
    assert _reader.get_config_file.cache_info().currsize == 0
