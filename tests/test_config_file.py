"""`read_config_file`, the reader of `serve --config` and of rerankers files, holds a file to the
API's caps: size, UTF-8 by line, nesting depth, integer length."""

import pytest

from cisrank.config import read_config_file
from cisrank.data import datasets
from cisrank.errors import CisrankError
from cisrank.serving.config import ServerConfig


def _refused(path) -> str:
    with pytest.raises(CisrankError) as raised:
        ServerConfig.load(path)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_hostile_server_config_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """Before: a non-UTF-8 byte was a UnicodeDecodeError traceback, a file had no size cap, and
    a value nested 65 to ~1,000 levels deep was accepted."""
    cfg = tmp_path / "server.json"
    cfg.write_bytes(b'{\n  "rerankers": {\n    "caf\xe9": {"kind": "dense"}}}\n')
    assert _refused(cfg) == (
        f"{cfg}:3: not UTF-8 (byte 0xe9 at column 9): give the server config as UTF-8"
    )
    cfg.write_text('{"rerankers": {"a": {"kind": "dense", "x": ' + "[" * 65 + "]" * 65 + "}}}")
    assert _refused(cfg) == (
        f"{cfg}: not valid JSON: JSON nested too deep: at most 64 levels of arrays and objects"
    )
    cfg.write_text('{"port": 1' + "0" * 5000 + "}")
    assert _refused(cfg).startswith(f"{cfg}: not valid JSON: a JSON integer is too long: at most")
    cfg.write_text('{\n  "port": 8080,\n  "host" "x"\n}')
    assert _refused(cfg) == (
        f"{cfg}: not valid JSON: invalid JSON (Expecting ':' delimiter at line 3 column 10)"
    )
    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 16)
    cfg.write_text('{"port": 8080, "host": "127.0.0.1"}')
    assert _refused(cfg) == f"{cfg}: over 16 bytes, the limit of a server config"


def test_a_deep_yaml_config_is_refused_by_the_same_depth(tmp_path):
    pytest.importorskip("yaml")
    cfg = tmp_path / "server.yaml"
    cfg.write_text("port: 8080\nx: " + "[" * 65 + "]" * 65 + "\n")
    with pytest.raises(CisrankError) as raised:
        read_config_file(cfg, "server config")
    assert str(raised.value) == (
        f"{cfg}: not valid YAML: JSON nested too deep: at most 64 levels of arrays and objects"
    )
    cfg.write_text("port: 8080\nx: " + "[" * 63 + "]" * 63 + "\n")  # 64 levels with the top
    assert read_config_file(cfg, "server config")["port"] == 8080


def test_a_manifest_or_provenance_nested_too_deep_is_damage_not_a_traceback(tmp_path):
    """Index manifests and model provenances stay on json.loads (a damaged one is caught by its
    digest), but a file of 100,000 nested brackets failed before the digest was checked: a
    RecursionError traceback. It is a damaged file, named, now."""
    from cisrank.data.manifest import MANIFEST_FILE, read_manifest
    from cisrank.errors import DamagedFileError
    from cisrank.models.integrity import PROVENANCE_FILE, read_provenance

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / MANIFEST_FILE).write_text(deep)
    with pytest.raises(DamagedFileError, match="not a JSON manifest: maximum recursion"):
        read_manifest(tmp_path)
    (tmp_path / PROVENANCE_FILE).write_text(deep)
    with pytest.raises(DamagedFileError, match="not the JSON a pull writes: maximum recursion"):
        read_provenance(tmp_path)
    from cisrank.runtimes.checked_cache import read_record

    with pytest.raises(ValueError, match="nested too deep to be a record"):
        read_record(tmp_path, PROVENANCE_FILE)  # a conversion cache's: made again, not a crash
