"""SSRF rules for backend URLs: refused forms first, then what passes and how it is pinned."""

from __future__ import annotations

import pytest

from rlgw.netguard import TargetRefused, check_backend_url, parse_allowlist

LOOPBACK = parse_allowlist("127.0.0.0/8,::1/128")
PRIVATE_NOT_LOOPBACK = parse_allowlist("10.0.0.0/8")


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host} must be refused before any DNS lookup")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://[::ffff:a9fe:a9fe]/", "link-local"),
        ("http://2852039166/", "non-canonical"),
        ("http://0251.0376.0251.0376/", "non-canonical"),
        ("http://0xa9fea9fe/", "non-canonical"),
        ("http://0xa9.0xfe.0xa9.0xfe/", "non-canonical"),
        ("http://127.1:8000/", "non-canonical"),
        ("http://0177.0.0.1:8000/", "non-canonical"),
        ("http://0/", "non-canonical"),
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://[::]:8000/", "unspecified"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fe80::1%25eth0]/", "zone"),
        ("http://[fd00:ec2::254]/", "link-local"),
        ("http://[fd12:3456::1]/", "not in RLGW_BACKEND_ALLOWLIST"),
        ("http://[64:ff9b::a9fe:a9fe]/", "IPv4-embedding"),
        ("http://10.0.0.1:8000/", "not in RLGW_BACKEND_ALLOWLIST"),
        ("http://192.168.1.10/", "not in RLGW_BACKEND_ALLOWLIST"),
        ("http://100.100.100.200/", "metadata"),
        ("http://224.0.0.1/", "multicast"),
        ("http://255.255.255.255/", "reserved"),
        ("http://user:pass@127.0.0.1:8000/", "credentials"),
        ("http://user@127.0.0.1:8000/", "credentials"),
        ("ftp://127.0.0.1/", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("gopher://127.0.0.1:6379/_INFO", "only http and https"),
        ("//127.0.0.1:8000", "only http and https"),
        ("http://127.0.0.1:8000/?next=http://169.254.169.254", "query"),
        ("http://127.0.0.1:8000/#frag", "query"),
        ("http://127.0.0.1:99999/", "invalid port"),
        ("http://127.0.0.1\t.evil/", "printable ASCII"),
        ("http://127.0.0.1\\@169.254.169.254/", "printable"),
        ("http:///v1", "needs a host"),
        ("http://127.0.0.1:8000/a/../b", "dot segments"),
    ],
)
def test_refused_forms(url: str, why: str) -> None:
    with pytest.raises(TargetRefused, match=why):
        check_backend_url(url, LOOPBACK, resolver=no_dns)


def test_the_refusal_never_echoes_credentials() -> None:
    with pytest.raises(TargetRefused) as info:
        check_backend_url("http://admin:s3cr3t-pw@127.0.0.1:8000", LOOPBACK, resolver=no_dns)
    assert "s3cr3t-pw" not in str(info.value)


def test_localhost_aliases_are_refused_when_loopback_is_not_allowlisted() -> None:
    for url in ("http://127.0.0.1:8000", "http://[::1]:8000", "http://[::ffff:127.0.0.1]:8000"):
        with pytest.raises(TargetRefused, match="not in RLGW_BACKEND_ALLOWLIST"):
            check_backend_url(url, PRIVATE_NOT_LOOPBACK, resolver=no_dns)
    with pytest.raises(TargetRefused, match="not in RLGW_BACKEND_ALLOWLIST"):
        check_backend_url(
            "http://localhost:8000", PRIVATE_NOT_LOOPBACK, resolver=lambda h, p: ["127.0.0.1"]
        )


def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    with pytest.raises(TargetRefused, match=r"evil\.example -> 10\.1\.2\.3 is not in"):
        check_backend_url("http://evil.example:8000", LOOPBACK, resolver=lambda h, p: ["10.1.2.3"])
    with pytest.raises(TargetRefused, match="link-local"):
        check_backend_url(
            "http://evil.example", LOOPBACK, resolver=lambda h, p: ["::ffff:169.254.169.254"]
        )


def test_every_resolved_address_must_pass() -> None:
    with pytest.raises(TargetRefused, match="169.254.169.254"):
        check_backend_url(
            "http://mixed.example", LOOPBACK, resolver=lambda h, p: ["127.0.0.1", "169.254.169.254"]
        )


def test_a_listed_host_name_does_not_unlock_metadata_addresses() -> None:
    allow = parse_allowlist("127.0.0.0/8, vllm")
    target = check_backend_url("http://vllm:8000", allow, resolver=lambda h, p: ["172.18.0.3"])
    assert target.address == "172.18.0.3"
    with pytest.raises(TargetRefused, match="link-local"):
        check_backend_url("http://vllm:8000", allow, resolver=lambda h, p: ["169.254.169.254"])


def test_a_broad_network_does_not_unlock_link_local_but_a_narrow_one_does() -> None:
    with pytest.raises(TargetRefused, match="link-local"):
        check_backend_url("http://169.254.169.254", parse_allowlist("0.0.0.0/0"))
    target = check_backend_url("http://169.254.10.2:8000", parse_allowlist("169.254.10.0/24"))
    assert target.address == "169.254.10.2"


def test_skipping_the_allowlist_keeps_the_other_rules() -> None:
    assert check_backend_url("http://10.1.2.3:8000", None).address == "10.1.2.3"
    for url in ("http://169.254.169.254", "http://0.0.0.0:1", "http://u:p@10.0.0.1"):
        with pytest.raises(TargetRefused):
            check_backend_url(url, None)


def test_dns_is_resolved_once_and_the_address_is_pinned() -> None:
    calls: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return ["127.0.0.1", "::1"]

    target = check_backend_url("https://models.internal:8443/base/", LOOPBACK, resolver=resolver)
    assert calls == [("models.internal", 8443)]
    assert target.url == "https://models.internal:8443/base"
    assert target.request_url("/v1/models") == "https://127.0.0.1:8443/base/v1/models"
    assert target.host_header == "models.internal:8443"
    assert target.extensions == {"sni_hostname": "models.internal"}


def test_ipv6_literals_are_bracketed_when_pinned() -> None:
    target = check_backend_url("http://[::1]:8100", LOOPBACK, resolver=no_dns)
    assert target.request_url("/weight_info") == "http://[::1]:8100/weight_info"
    assert target.host_header == "[::1]:8100"
    assert target.extensions == {}


def test_allowlist_entries_are_validated() -> None:
    with pytest.raises(ValueError):
        parse_allowlist("10.0.0.0/33")
    with pytest.raises(ValueError):
        parse_allowlist("10.0.0.1/8")  # host bits set: say 10.0.0.0/8
    with pytest.raises(ValueError):
        parse_allowlist("bad host!")
    allow = parse_allowlist("10.0.0.0/8 vllm, ::1")
    assert [str(n) for n in allow.networks] == ["10.0.0.0/8", "::1/128"]
    assert allow.hosts == {"vllm"}
