"""``reshard serve`` flags and ServeOptions: checked before anything listens."""

from __future__ import annotations

import json
import os

import pytest

from reshard import Cluster
from reshard import cli as reshard_cli
from reshard.errors import ClusterError, ReshardError
from reshard.lru import LruCache
from reshard.service.auth import check_listen, is_loopback, listen_address
from reshard.service.options import ServeOptions, TlsFiles
from reshard.service.runtime_host import DEADLINE_MARGIN, call_timeout, deadline_expired
from reshard.service.serve_cli import parse_cluster


def test_cluster_flag_forms(tmp_path):
    assert parse_cluster("4x2") == Cluster.regular(4, 2)
    assert parse_cluster("dgx-h100:2") == Cluster.preset("dgx-h100", 2)
    assert parse_cluster("paper:3x2") == Cluster.preset("paper", 3, 2)
    path = tmp_path / "c.json"
    odd = Cluster.from_hosts([[0, 5], [1]], name="lab", latency=1e-4)
    path.write_text(json.dumps(odd.to_dict()))
    assert parse_cluster(f"@{path}") == odd
    for bad in ("4", "x4", "nope:2", "4x2x1"):
        with pytest.raises(ClusterError):
            parse_cluster(bad)


@pytest.mark.parametrize("flags, message", [
    (["--host", "0.0.0.0"], "refusing to listen on the wildcard address"),
    (["--host", "::"], "refusing to listen on the wildcard address"),
    (["--host", "::0"], "refusing to listen on the wildcard address"),
    (["--host", "[::0]"], "refusing to listen on the wildcard address"),
    (["--host", "0:0:0:0:0:0:0:0"], "refusing to listen on the wildcard address"),
    (["--host", "10.1.2.3"], "which is not loopback, needs a token"),
    (["--tls-cert", "c.pem"], "TLS needs both --tls-cert and --tls-key"),
    (["--cluster", "zz:2"], "unknown cluster preset 'zz'"),
    (["--max-inline-mb", "64", "--max-message-mb", "64"], "must leave"),
    (["--max-estimates", "0"], "max_estimates must be an integer >= 1"),
    (["--answer-cache-mb", "0"], "answer_cache_bytes must be an integer >= 1"),
])
def test_bad_serve_flags_exit_2_before_listening(flags, message, capsys):
    assert reshard_cli.main(["serve", "--port", "0", *flags]) == 2
    assert message in capsys.readouterr().err


def test_estimate_many_budgets_come_from_their_flags():
    import argparse

    from reshard.service.serve_cli import add_arguments, options_from

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    o = options_from(ap.parse_args(["--max-estimates", "123", "--answer-cache-mb", "2"]))
    assert (o.max_estimates, o.answer_cache_bytes) == (123, 2 << 20)
    default = options_from(ap.parse_args([]))
    assert default.max_estimates == ServeOptions().max_estimates == 10_000
    assert default.answer_cache_bytes == ServeOptions().answer_cache_bytes == 32 << 20


def test_listen_rules():
    for host in ("127.0.0.1", "127.9.9.9", "localhost", "::1", "[::1]"):
        assert is_loopback(host)
        check_listen(host, None, None)
    for host in ("10.0.0.5", "example.org", "::2"):
        assert not is_loopback(host)
        with pytest.raises(ReshardError, match="needs a token"):
            check_listen(host, None, None)
        # a token without TLS would cross the network readable: refused unless insecure
        with pytest.raises(ReshardError, match="without TLS sends the token in plaintext"):
            check_listen(host, "tok", None)
        check_listen(host, "tok", None, insecure=True)
        check_listen(host, "tok", TlsFiles("c.pem", "k.pem"))
    assert listen_address("::1", 5) == "[::1]:5" and listen_address("[::1]", 5) == "[::1]:5"
    assert listen_address("127.0.0.1", 5) == "127.0.0.1:5"


def test_options_are_checked():
    with pytest.raises(ReshardError, match=r"port must be 0..65535"):
        ServeOptions(port=70000)
    with pytest.raises(ReshardError, match="workers must be an integer >= 1"):
        ServeOptions(workers=0)
    with pytest.raises(ReshardError, match="grace must be > 0"):
        ServeOptions(grace=float("nan"))
    assert "secret" not in repr(ServeOptions(token="secret"))


def test_deadlines_become_timeouts_with_a_margin():
    assert call_timeout(None, 60.0) == 60.0
    assert call_timeout(100.0, 60.0) == 60.0
    assert call_timeout(2.0, 60.0) == pytest.approx(2.0 - DEADLINE_MARGIN)
    assert call_timeout(0.2, 60.0) == pytest.approx(0.1)  # half of a short deadline
    assert deadline_expired(DEADLINE_MARGIN / 2) and not deadline_expired(1.0)
    assert not deadline_expired(None)


def test_lru_cache_evicts_by_weight():
    cache: LruCache[str, str] = LruCache(10, weigh=len)
    cache.put("a", "xxxx")
    cache.put("b", "yyyy")
    assert cache.get("a") == "xxxx"  # a is now the most recent
    cache.put("c", "zzzz")  # 12 > 10: b (least recent) goes
    assert cache.get("b") is None and cache.get("a") == "xxxx" and cache.get("c") == "zzzz"
    cache.put("d", "w" * 11)  # heavier than the whole cache: not kept
    assert cache.get("d") is None and len(cache) == 2
    assert cache.get_or_make("e", lambda: "v") == "v" and cache.get("e") == "v"


def test_the_token_leaves_the_environment_once_read_and_an_open_file_is_warned(
        tmp_path, monkeypatch):
    from reshard.service import serve_cli

    monkeypatch.setenv(serve_cli.TOKEN_ENV, "s3cret")
    assert serve_cli._token(None) == "s3cret"
    assert serve_cli.TOKEN_ENV not in os.environ  # the workers it starts do not inherit it
    path = tmp_path / "token"
    path.write_text("t0k\n")
    path.chmod(0o644)
    warning = serve_cli.token_file_warning(str(path))
    assert warning is not None and "mode 644" in warning and "chmod 600" in warning
    path.chmod(0o600)
    assert serve_cli.token_file_warning(str(path)) is None
    assert serve_cli._token(str(path)) == "t0k"


def test_a_public_address_needs_tls_or_insecure(tmp_path, capsys):
    path = tmp_path / "token"
    path.write_text("t0k")
    path.chmod(0o600)
    flags = ["serve", "--port", "0", "--host", "10.1.2.3", "--token-file", str(path)]
    assert reshard_cli.main(flags) == 2
    assert "without TLS sends the token in plaintext" in capsys.readouterr().err
