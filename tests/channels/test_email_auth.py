"""Sender authentication: DKIM signed with a test key, SPF and DMARC alignment, a trusted MTA's
Authentication-Results; all DNS through a stub resolver."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.email.auth import (
    DnsTemporaryError,
    Envelope,
    aligned,
    authenticate,
    org_domain,
)

MESSAGE = (
    b"From: Alice <alice@example.com>\r\nTo: assistant@acme.example\r\n"
    b"Subject: Quarterly numbers\r\nMessage-ID: <q1@example.com>\r\n"
    b"Date: Sat, 01 Mar 2025 10:00:00 +0000\r\n\r\nCan you summarise the attached numbers?\r\n"
)
OUTSIDE = Envelope(client_ip="198.51.100.7", helo="mail.example.net", mail_from="b@example.net")


@dataclass
class StubDns:
    """Answers from a table; counts lookups; can fail like a DNS timeout."""

    records: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    failing: bool = False
    lookups: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, name: str, rdtype: str) -> Sequence[str]:
        self.lookups.append((name, rdtype))
        if self.failing:
            raise DnsTemporaryError(f"timeout for {name}")
        return self.records.get((name, rdtype), [])


@dataclass(frozen=True)
class SigningKey:
    private_pem: bytes
    dns_record: str


@pytest.fixture(scope="module")
def key() -> SigningKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return SigningKey(pem, "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode())


def sign(message: bytes, key: SigningKey, domain: str = "example.com") -> bytes:
    signature = dkim.sign(
        message,
        b"test",
        domain.encode(),
        key.private_pem,
        include_headers=[b"from", b"to", b"subject", b"date", b"message-id"],
    )
    return bytes(signature) + message


def dns_for(key: SigningKey, **extra: list[str]) -> StubDns:
    records = {
        ("test._domainkey.example.com", "TXT"): [key.dns_record],
        ("test._domainkey.mailer.example.com", "TXT"): [key.dns_record],
        ("test._domainkey.evil.example", "TXT"): [key.dns_record],
        ("_dmarc.example.com", "TXT"): ["v=DMARC1; p=reject"],
    }
    records.update({(name.replace("__", "."), "TXT"): value for name, value in extra.items()})
    return StubDns(records)


def test_an_aligned_dkim_signature_passes(key: SigningKey) -> None:
    verdict = authenticate(
        sign(MESSAGE, key), mode="verify", envelope=OUTSIDE, resolver=dns_for(key)
    )
    assert verdict.passed
    assert (verdict.dkim, verdict.dkim_domains, verdict.dmarc) == ("pass", ("example.com",), "pass")


def test_a_subdomain_signature_aligns_in_relaxed_mode(key: SigningKey) -> None:
    signed = sign(MESSAGE, key, domain="mailer.example.com")
    assert authenticate(signed, mode="verify", envelope=OUTSIDE, resolver=dns_for(key)).passed


def test_strict_dkim_alignment_refuses_a_subdomain(key: SigningKey) -> None:
    signed = sign(MESSAGE, key, domain="mailer.example.com")
    dns = dns_for(key, _dmarc__example__com=["v=DMARC1; p=reject; adkim=s"])
    verdict = authenticate(signed, mode="verify", envelope=OUTSIDE, resolver=dns)
    assert not verdict.passed
    assert verdict.dmarc == "fail"


def test_a_forged_from_with_a_broken_signature_fails(key: SigningKey) -> None:
    forged = sign(MESSAGE, key).replace(b"Alice <alice@", b"Mallory <alice@")
    verdict = authenticate(forged, mode="verify", envelope=OUTSIDE, resolver=dns_for(key))
    assert not verdict.passed
    assert (verdict.dkim, verdict.dmarc) == ("fail", "fail")


def test_a_valid_signature_of_another_domain_is_misaligned(key: SigningKey) -> None:
    """The attacker signs correctly for their own domain but claims From: example.com."""
    signed = sign(MESSAGE, key, domain="evil.example")
    verdict = authenticate(signed, mode="verify", envelope=OUTSIDE, resolver=dns_for(key))
    assert verdict.dkim == "pass"
    assert verdict.dkim_domains == ("evil.example",)
    assert not verdict.passed
    assert verdict.reason.startswith("dmarc=fail")


def test_an_unsigned_mail_passes_on_aligned_spf(key: SigningKey) -> None:
    dns = dns_for(key, example__com=["v=spf1 ip4:192.0.2.0/24 -all"])
    sender = Envelope(client_ip="192.0.2.25", helo="mx.example.com", mail_from="alice@example.com")
    verdict = authenticate(MESSAGE, mode="verify", envelope=sender, resolver=dns)
    assert verdict.passed
    assert (verdict.spf, verdict.spf_domain, verdict.dkim) == ("pass", "example.com", "none")


def test_spf_from_an_unlisted_client_fails(key: SigningKey) -> None:
    dns = dns_for(key, example__com=["v=spf1 ip4:192.0.2.0/24 -all"])
    sender = Envelope(client_ip="203.0.113.9", helo="x", mail_from="alice@example.com")
    verdict = authenticate(MESSAGE, mode="verify", envelope=sender, resolver=dns)
    assert (verdict.passed, verdict.spf) == (False, "fail")


def test_dns_trouble_is_temporary(key: SigningKey) -> None:
    dns = dns_for(key)
    dns.failing = True
    verdict = authenticate(sign(MESSAGE, key), mode="verify", envelope=OUTSIDE, resolver=dns)
    assert not verdict.passed
    assert verdict.temporary


def test_off_mode_passes_without_any_lookup() -> None:
    dns = StubDns()
    assert authenticate(MESSAGE, mode="off", envelope=OUTSIDE, resolver=dns).passed
    assert dns.lookups == []


TRUSTED = "mx.acme.example"


def trusted_mail(*top: str, below: Sequence[str] = ()) -> bytes:
    lines = [*top, f"Received: from outside.example by {TRUSTED} with ESMTP", *below]
    return ("\r\n".join(lines) + "\r\n").encode() + MESSAGE


def test_trusted_mta_verdict_is_read_from_its_own_header() -> None:
    data = trusted_mail(f"Authentication-Results: {TRUSTED}; dmarc=pass header.from=example.com")
    verdict = authenticate(
        data, mode="trusted_mta", envelope=Envelope(), trusted_authserv_id=TRUSTED
    )
    assert verdict.passed
    assert verdict.dmarc == "pass"


def test_trusted_mta_failure_is_not_routed() -> None:
    data = trusted_mail(f"Authentication-Results: {TRUSTED}; dmarc=fail header.from=example.com")
    verdict = authenticate(
        data, mode="trusted_mta", envelope=Envelope(), trusted_authserv_id=TRUSTED
    )
    assert not verdict.passed


def test_results_that_arrived_from_outside_are_ignored() -> None:
    """A sender forging our MTA's authserv-id below its Received header gains nothing."""
    forged = f"Authentication-Results: {TRUSTED}; dmarc=pass header.from=example.com"
    data = trusted_mail(below=[forged])
    verdict = authenticate(
        data, mode="trusted_mta", envelope=Envelope(), trusted_authserv_id=TRUSTED
    )
    assert not verdict.passed
    other_id = trusted_mail("Authentication-Results: someone.else; dmarc=pass")
    assert not authenticate(
        other_id, mode="trusted_mta", envelope=Envelope(), trusted_authserv_id=TRUSTED
    ).passed


def test_a_dmarc_pass_for_another_domain_does_not_count() -> None:
    data = trusted_mail(f"Authentication-Results: {TRUSTED}; dmarc=pass header.from=evil.example")
    assert not authenticate(
        data, mode="trusted_mta", envelope=Envelope(), trusted_authserv_id=TRUSTED
    ).passed


@pytest.mark.parametrize(
    ("domain", "organizational"),
    [
        ("mail.example.co.uk", "example.co.uk"),
        ("a.b.example.com", "example.com"),
        ("example.com", "example.com"),
    ],
)
def test_organizational_domains(domain: str, organizational: str) -> None:
    assert org_domain(domain) == organizational


def test_alignment() -> None:
    assert aligned("mail.example.com", "example.com", strict=False)
    assert not aligned("mail.example.com", "example.com", strict=True)
    assert not aligned("example.org", "example.com", strict=False)


@settings(max_examples=100, deadline=None)
@given(
    signature=st.binary(max_size=400),
    body=st.binary(max_size=400),
    client_ip=st.sampled_from(["192.0.2.1", "::1", "not-an-ip", ""]),
    mail_from=st.text(max_size=40),
)
def test_fuzz_authenticate_gives_a_verdict_on_any_input(
    signature: bytes, body: bytes, client_ip: str, mail_from: str
) -> None:
    data = b"DKIM-Signature: " + signature + b"\r\nFrom: a@example.com\r\n\r\n" + body
    dns = StubDns({("example.com", "TXT"): ["v=spf1 ip4:192.0.2.0/24 mx a -all"]})
    verdict = authenticate(
        data,
        mode="verify",
        envelope=Envelope(client_ip=client_ip, helo="h", mail_from=mail_from),
        resolver=dns,
    )
    assert isinstance(verdict.passed, bool)
