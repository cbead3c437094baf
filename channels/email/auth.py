"""Who really sent a mail: DKIM, SPF and DMARC alignment, or a trusted MTA's verdict.

Modes (``channels.email.auth.mode``):

* ``verify``: check DKIM signatures (dkimpy) and SPF for the connecting client (pyspf), then
  require DMARC alignment with the From domain: a passing DKIM signature whose ``d=``, or a
  passing SPF check whose MAIL FROM domain, matches the From domain (relaxed: the same
  organizational domain, per the public suffix list; strict where the domain's DMARC record
  says ``adkim=s`` / ``aspf=s``). Alignment is required even when the domain publishes no
  DMARC record: an unauthenticated From would let anyone talk as anyone.
* ``trusted_mta``: read the verdict from the ``Authentication-Results`` headers of the MTA in
  front of us (its authserv-id), ignoring any that arrived from outside: only those above that
  MTA's own ``Received`` header (the topmost one naming it; else the topmost one) count.
* ``off``: everything passes (development only).

All DNS goes through a `Resolver` (``(name, type) -> records``), so tests resolve through a
stub and the gateway runs the whole check in a worker thread (`authenticate` is blocking).
"""

from __future__ import annotations

import ipaddress
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any, Literal

import authres  # type: ignore[import-untyped]
import authres.core  # type: ignore[import-untyped]
import dkim  # type: ignore[import-untyped]
import dkim.util  # type: ignore[import-untyped]
import dns.exception
import dns.resolver
from publicsuffix2 import PublicSuffixList  # type: ignore[import-untyped]

from channels.email import headers

AuthMode = Literal["verify", "trusted_mta", "off"]
Resolver = Callable[[str, str], Sequence[str]]
"""DNS lookup: (name, record type) → the records as text; [] when there are none; raises
`DnsTemporaryError` when the answer is unknown (timeout, no server)."""

DNS_TIMEOUT = 5.0
# What dkimpy and pyspf raise on hostile input besides their own errors (bad base64, odd
# tag values, non-ASCII names …): counted as a failed check, never as a crash.
_BROKEN_INPUT = (dkim.DKIMException, ValueError, TypeError, IndexError, KeyError, UnicodeError)


class DnsTemporaryError(Exception):
    """DNS could not answer now; the sender should try again later."""


def dns_resolver(name: str, rdtype: str) -> list[str]:
    """The real resolver (dnspython); blocking, so callers run it in a worker thread. TXT
    records come back with their strings joined, MX as "preference exchange"."""
    try:
        answer = dns.resolver.resolve(name, rdtype, lifetime=DNS_TIMEOUT, search=False)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    except (dns.exception.Timeout, dns.resolver.NoNameservers) as exc:
        raise DnsTemporaryError(f"{rdtype} {name}: {exc}") from exc
    except dns.exception.DNSException:
        return []  # a malformed name or answer: as good as no record
    records = []
    for rdata in answer:
        if rdtype == "TXT":
            records.append(b"".join(rdata.strings).decode("utf-8", "replace"))
        elif rdtype == "MX":
            records.append(f"{rdata.preference} {rdata.exchange.to_text(omit_final_dot=True)}")
        else:
            records.append(rdata.to_text().rstrip("."))
    return records


@dataclass(frozen=True, slots=True)
class AuthVerdict:
    """The outcome: `passed` routes the mail; `temporary` asks the sender to retry (DNS
    trouble); the rest explains the decision (logged, shown by ``gateway email parse``)."""

    passed: bool
    mode: AuthMode
    reason: str
    from_domain: str = ""
    dkim: str = "none"
    dkim_domains: tuple[str, ...] = ()
    spf: str = "none"
    spf_domain: str = ""
    dmarc: str = "none"
    temporary: bool = False
    details: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the SMTP session told us: the client's IP, its HELO name and the MAIL FROM."""

    client_ip: str | None = None
    helo: str = ""
    mail_from: str = ""


def authenticate(
    data: bytes,
    *,
    mode: AuthMode,
    envelope: Envelope,
    resolver: Resolver = dns_resolver,
    trusted_authserv_id: str | None = None,
) -> AuthVerdict:
    """The verdict on `data` (raw mail) in `mode`. Blocking (DNS): run it in a thread."""
    if mode == "off":
        return AuthVerdict(True, mode, "authentication is off")
    message = headers.read_headers(data)
    sender = headers.sender(message) if message is not None else None
    if sender is None:
        return AuthVerdict(False, mode, "no From address")
    from_domain = sender[0].rpartition("@")[2].lower()
    if mode == "trusted_mta":
        return _trusted_verdict(data, from_domain, trusted_authserv_id or "")
    return _verify(data, from_domain, envelope, resolver)


# --- verify ------------------------------------------------------------------------------


def _verify(data: bytes, from_domain: str, envelope: Envelope, resolver: Resolver) -> AuthVerdict:
    dkim_result, dkim_domains = check_dkim(data, resolver)
    spf_result, spf_domain = check_spf(envelope, resolver)
    try:
        record = dmarc_record(from_domain, resolver)
    except DnsTemporaryError:
        record = {}
        dkim_result = "temperror" if dkim_result != "pass" else dkim_result
    strict_dkim = record.get("adkim") == "s"
    strict_spf = record.get("aspf") == "s"
    aligned_dkim = [d for d in dkim_domains if aligned(d, from_domain, strict=strict_dkim)]
    aligned_spf = spf_result == "pass" and aligned(spf_domain, from_domain, strict=strict_spf)
    verdict = AuthVerdict(
        False,
        "verify",
        "",
        from_domain=from_domain,
        dkim=dkim_result,
        dkim_domains=tuple(dkim_domains),
        spf=spf_result,
        spf_domain=spf_domain,
    )
    if aligned_dkim or aligned_spf:
        how = f"dkim d={aligned_dkim[0]}" if aligned_dkim else f"spf {spf_domain}"
        return replace(verdict, passed=True, reason=f"dmarc=pass ({how})", dmarc="pass")
    if "temperror" in (dkim_result, spf_result):
        return replace(verdict, reason="dmarc=temperror (DNS)", dmarc="temperror", temporary=True)
    return replace(verdict, reason="dmarc=fail: no aligned DKIM or SPF pass", dmarc="fail")


def check_dkim(data: bytes, resolver: Resolver) -> tuple[str, list[str]]:
    """("pass" | "fail" | "none" | "temperror", the d= domains of the passing signatures)."""
    try:
        signer = dkim.DKIM(data, timeout=DNS_TIMEOUT)
        count = sum(1 for name, _ in signer.headers if name.lower() == b"dkim-signature")
    except _BROKEN_INPUT:
        return "fail", []
    if count == 0:
        return "none", []

    def txt(name: bytes | str, timeout: float = DNS_TIMEOUT) -> bytes | None:
        """dkimpy's DNS hook: the key record for a selector, through our resolver."""
        text = name.decode("ascii", "replace") if isinstance(name, bytes) else name
        try:
            records = resolver(text.rstrip("."), "TXT")
        except DnsTemporaryError as exc:
            raise dkim.DnsTimeoutError(str(exc)) from exc
        return records[0].encode() if records else None

    passed: list[str] = []
    temporary = False
    for index in range(min(count, 5)):  # a mail with more signatures gets no more checks
        try:
            if signer.verify(idx=index, dnsfunc=txt):
                passed.append(_signature_domain(signer, index))
        except dkim.DnsTimeoutError:
            temporary = True
        except _BROKEN_INPUT:  # a malformed signature or key: that signature fails
            continue
    if passed:
        return "pass", [domain for domain in passed if domain]
    return ("temperror" if temporary else "fail"), []


def _signature_domain(signer: Any, index: int) -> str:
    signatures = [value for name, value in signer.headers if name.lower() == b"dkim-signature"]
    try:
        tags = dkim.util.parse_tag_value(signatures[index])
    except (dkim.util.InvalidTagValueList, IndexError):
        return ""
    return bytes(tags.get(b"d", b"")).decode("ascii", "replace").strip().lower()


def check_spf(envelope: Envelope, resolver: Resolver) -> tuple[str, str]:
    """(the SPF result for the client and MAIL FROM, the domain checked)."""
    mail_from = envelope.mail_from.strip("<> ")
    domain = (mail_from.rpartition("@")[2] or envelope.helo).lower()
    if not envelope.client_ip or not domain:
        return "none", domain
    try:
        ipaddress.ip_address(envelope.client_ip)
    except ValueError:
        return "none", domain
    try:
        query = _spf_query_class()(
            i=envelope.client_ip,
            s=mail_from or f"postmaster@{domain}",
            h=envelope.helo or domain,
            timeout=DNS_TIMEOUT,
            querytime=4 * DNS_TIMEOUT,
        )
        query.resolver = resolver
        result, _code, _explanation = query.check()
    except _BROKEN_INPUT:  # pyspf on input it does not expect: no SPF verdict
        return "permerror", domain
    return str(result), domain


@lru_cache(maxsize=1)
def _spf_query_class() -> Any:
    """pyspf's query with DNS through our resolver. pyspf is imported here, once: it raises a
    DeprecationWarning (an invalid escape) while compiling, which must not fail strict runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import spf  # type: ignore[import-untyped]  # noqa: PLC0415

    class ResolverQuery(spf.query):  # type: ignore[misc]
        """An SPF check whose DNS lookups go through `resolver` (set on each instance)."""

        resolver: Resolver

        def dns(self, name: str, qtype: str, cnames: Any = None, ignore_void: bool = False) -> Any:
            """pyspf's one DNS entry point, answered in the shapes pyspf expects."""
            try:
                records = self.resolver(str(name).rstrip("."), qtype)
            except DnsTemporaryError as exc:
                raise spf.TempError(f"DNS {exc}") from exc
            if qtype in ("TXT", "SPF"):
                return [[record.encode()] for record in records]
            if qtype == "MX":
                pairs = (record.split(None, 1) for record in records)
                return [(int(pref), host) for pref, host in pairs if pref.isdigit()]
            return list(records)

    return ResolverQuery


def dmarc_record(domain: str, resolver: Resolver) -> dict[str, str]:
    """The DMARC tags that apply to `domain` (its own record, else its organizational
    domain's), or {} when there is none."""
    for candidate in dict.fromkeys((domain, org_domain(domain))):
        for record in resolver(f"_dmarc.{candidate}", "TXT"):
            if record.strip().lower().startswith("v=dmarc1"):
                return _tags(record)
    return {}


def _tags(record: str) -> dict[str, str]:
    tags = {}
    for item in record.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            tags[key.strip().lower()] = value.strip().lower()
    return tags


@lru_cache(maxsize=1)
def _suffixes() -> Any:
    return PublicSuffixList()


@lru_cache(maxsize=4096)
def org_domain(domain: str) -> str:
    """The organizational (registrable) domain: ``mail.example.co.uk`` → ``example.co.uk``."""
    domain = domain.lower().rstrip(".")
    found = _suffixes().get_sld(domain) or domain
    if "." not in found:  # an unknown suffix: take the last two labels
        found = ".".join(domain.split(".")[-2:])
    return str(found)


def aligned(domain: str, from_domain: str, *, strict: bool) -> bool:
    """DMARC identifier alignment of `domain` with the From domain."""
    domain, from_domain = domain.lower().rstrip("."), from_domain.lower().rstrip(".")
    if not domain or not from_domain:
        return False
    if strict:
        return domain == from_domain
    return org_domain(domain) == org_domain(from_domain)


# --- trusted_mta --------------------------------------------------------------------------


def _trusted_verdict(data: bytes, from_domain: str, authserv_id: str) -> AuthVerdict:
    results = trusted_results(data, authserv_id)
    dmarc = next((r for r in results if r[0] == "dmarc"), None)
    dkim_pass = [
        value for method, result, value in results if method == "dkim" and result == "pass"
    ]
    details = tuple(f"{method}={result}" for method, result, _ in results)
    if dmarc is not None and dmarc[1] == "pass" and (not dmarc[2] or dmarc[2] == from_domain):
        return AuthVerdict(
            True,
            "trusted_mta",
            f"{authserv_id}: dmarc=pass",
            from_domain,
            dmarc="pass",
            details=details,
        )
    aligned_dkim = [d for d in dkim_pass if aligned(d, from_domain, strict=False)]
    if dmarc is None and aligned_dkim:
        return AuthVerdict(
            True,
            "trusted_mta",
            f"{authserv_id}: dkim=pass d={aligned_dkim[0]}",
            from_domain,
            dkim="pass",
            dkim_domains=tuple(aligned_dkim),
            dmarc="none",
            details=details,
        )
    reason = f"{authserv_id}: " + (", ".join(details) if details else "no verdict for this mail")
    return AuthVerdict(
        False,
        "trusted_mta",
        reason,
        from_domain,
        dmarc=dmarc[1] if dmarc else "none",
        details=details,
    )


_RECEIVED_BY = re.compile(r"\bby\s+([^\s;()]+)", re.I)


def trusted_results(data: bytes, authserv_id: str) -> list[tuple[str, str, str]]:
    """(method, result, domain) of the Authentication-Results our MTA added: those with its
    authserv-id above its own Received header; anything lower came from outside."""
    message = headers.read_headers(data)
    if message is None:
        return []
    items = [(name.lower(), headers.clean(str(value))) for name, value in message.raw_items()]
    received = [i for i, (name, _) in enumerate(items) if name == "received"]
    border = next(
        (i for i in received if _received_by(items[i][1]) == authserv_id.lower()),
        received[0] if received else len(items),
    )
    found: list[tuple[str, str, str]] = []
    for name, value in items[:border]:
        if name != "authentication-results":
            continue
        try:
            header = authres.AuthenticationResultsHeader.parse_value(value)
        except (authres.core.AuthResError, ValueError, IndexError, AttributeError):
            continue
        if str(header.authserv_id).lower() != authserv_id.lower():
            continue
        for result in header.results:
            found.append((str(result.method), str(result.result), _result_domain(result)))
    return found


def _received_by(value: str) -> str:
    match = _RECEIVED_BY.search(value)
    return match.group(1).lower().rstrip(".") if match else ""


def _result_domain(result: Any) -> str:
    for prop in getattr(result, "properties", ()):
        if (prop.type, prop.name) in (("header", "from"), ("header", "d")):
            return str(prop.value).lower()
        if (prop.type, prop.name) == ("header", "i"):
            return str(prop.value).rpartition("@")[2].lower()
    return ""
