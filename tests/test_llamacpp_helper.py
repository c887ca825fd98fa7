"""meshd.testing.llamacpp: finding llama.cpp's built tools, and a llama-server that starts,
answers and stops (skipped where scripts/build_llama_cpp.sh has not been run)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from meshd.testing import llamacpp
from meshd.testing.llamacpp import llama_bin, llama_server, missing_reason, proc_status_kb


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_env_dir_wins_and_its_bin_folder_is_searched(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _exe(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv(llamacpp.ENV_DIR, str(tmp_path))
    assert llama_bin("llama-server") == exe
    monkeypatch.setenv(llamacpp.ENV_DIR, str(tmp_path / "bin"))
    assert llama_bin("llama-server") == exe
    assert llama_bin("llama-bench") is None
    assert "llama-bench is not built" in missing_reason("llama-bench")


def test_a_file_that_is_not_executable_is_not_a_tool(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llama-server").write_text("")
    monkeypatch.setenv(llamacpp.ENV_DIR, str(tmp_path))
    assert llama_bin("llama-server") is None


def test_a_worktree_falls_back_to_the_main_checkouts_build(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(llamacpp.ENV_DIR, raising=False)
    main, wt = tmp_path / "main", tmp_path / "wt"
    gitdir = main / ".git" / "worktrees" / "wt"
    gitdir.mkdir(parents=True)
    (gitdir / "commondir").write_text("../..\n")
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {gitdir}\n")
    exe = _exe(main / "build" / "llama.cpp" / "bin" / "llama-perplexity")
    assert llama_bin("llama-perplexity", repo=wt) == exe
    assert llama_bin("llama-perplexity", repo=main) == exe
    own = _exe(wt / "build" / "llama.cpp" / "bin" / "llama-perplexity")
    assert llama_bin("llama-perplexity", repo=wt) == own


def test_proc_status_reads_this_process_peak_rss() -> None:
    import os

    peak = proc_status_kb(os.getpid(), "VmHWM")
    assert peak is not None and peak > 1000
    assert proc_status_kb(os.getpid(), "NoSuchField") is None


@pytest.mark.slow
def test_llama_server_starts_generates_and_stops(tmp_path: Path) -> None:
    if llama_bin("llama-server") is None:
        pytest.skip(missing_reason("llama-server"))
    if not llamacpp.have_gguf_writer():
        pytest.skip("the gguf package (to write a test model) is not installed")
    gguf = llamacpp.write_tiny_gguf(tmp_path / "tiny.gguf")
    with llama_server(gguf, threads=1, ctx_size=256, timeout_s=60) as server:
        assert server.load_s > 0
        with server.client(timeout_s=30) as c:
            r = c.post("/completion", json={"prompt": "the and of", "n_predict": 8,
                                            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200
        body = r.json()
        assert body["tokens_predicted"] == 8
        assert body["timings"]["predicted_n"] == 8
        peak = server.peak_rss_kb()
        assert peak is not None and peak > 0
        proc = server.proc
    assert proc.poll() is not None
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.base_url + "/health", timeout=1.0)


@pytest.mark.slow
def test_a_server_that_cannot_load_its_model_fails_with_its_log(tmp_path: Path) -> None:
    if llama_bin("llama-server") is None:
        pytest.skip(missing_reason("llama-server"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(RuntimeError, match="llama-server exited"), \
            llama_server(bad, threads=1, ctx_size=256, timeout_s=60):
        pass
