"""Bot Framework authentication for the Teams channel: who may post activities to the bot, and
how the bot proves itself when it answers.

Inbound, `ActivityAuthenticator` runs botbuilder's own validation
(`ConfigurationBotFrameworkAuthentication`: issuer, signature with the keys from the OpenID
metadata document, expiry, audience = app id, `serviceurl` claim = the activity's service URL,
signing-key endorsements for the channel), plus a tenant allow-list. Around the SDK:

- The SDK fetches signing keys with a blocking `requests.get` on the event loop. `SigningKeys`
  fetches them with httpx and is put into the SDK's per-URL metadata cache
  (`JwtTokenExtractor.metadataCache`), the one seam the SDK offers, so its fetch never runs.
- The SDK raises `PermissionError`s, PyJWT errors, `IndexError`s and bare `Exception`s; each
  becomes a `ChannelAuthError` whose message is a short reason (logged, answered with 401).
- Only tokens of the Bot Framework channel service are accepted: the SDK would also try
  Emulator and skill tokens, which Teams never sends.

Outbound, `BotCredentials` is the SDK's `AppCredentials` with a token obtained by an OAuth2
client-credentials POST of its own (MSAL refuses plain-http token URLs and blocks the loop);
`refresh()` fetches asynchronously and caches the token until shortly before it expires, and the
connector's synchronous `get_access_token` only reads that cache.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import jwt
import structlog
from botbuilder.integration.aiohttp import (  # type: ignore[import-untyped]  # (untyped SDK)
    ConfigurationBotFrameworkAuthentication,
)
from botbuilder.schema import Activity  # type: ignore[import-untyped]
from botframework.connector.auth import (  # type: ignore[import-untyped]
    AppCredentials,
    JwtTokenExtractor,
    ServiceClientCredentialsFactory,
)
from jwt.algorithms import RSAAlgorithm

from errors import ChannelAuthError, DeliveryError

log = structlog.stdlib.get_logger(__name__)

BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"
DEFAULT_OPENID_METADATA_URL = "https://login.botframework.com/v1/.well-known/openidconfiguration"
DEFAULT_TOKEN_URL = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"  # noqa: S105
DEFAULT_SCOPE = "https://api.botframework.com/.default"
KEYS_MAX_AGE = 24 * 3600.0  # the SDK's own refresh period
UNKNOWN_KEY_REFETCH_AFTER = 300.0  # an unknown key id refetches the keys at most this often
TOKEN_EARLY_REFRESH = 300.0  # renew the bot token this long before it expires

# Substrings of the SDK's error messages → the reason given in logs and 401 answers.
_SDK_REASONS = (
    ("Invalid AppId", "wrong audience"),
    ("'aud' claim", "wrong audience"),
    ("'iss' claim", "wrong issuer"),
    ("serviceurl", "service URL mismatch"),
    ("endorsement", "signing key not endorsed for this channel"),
    ("Identity missing", "token not accepted"),
)


class SigningKeysUnavailableError(ChannelAuthError):
    """The signing keys could not be fetched: not the sender's fault (answered with 503)."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One key from the JWKS, in the shape the SDK reads (`public_key`, `endorsements`)."""

    public_key: Any
    endorsements: tuple[str, ...]


class SigningKeys:
    """The signing keys named by an OpenID metadata document, fetched without blocking.

    Kept for a day; an unknown key id refetches them (at most every five minutes, so random
    key ids cannot make the gateway hammer the metadata endpoint).
    """

    def __init__(self, metadata_url: str, http: httpx.AsyncClient) -> None:
        self.metadata_url = metadata_url
        self._http = http
        self._keys: dict[str, SigningKey] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def get(self, key_id: str | None) -> SigningKey:
        """The key with this id; raises `ChannelAuthError` when there is none."""
        await self._refresh(older_than=KEYS_MAX_AGE)
        key = self._keys.get(key_id or "")
        if key is None:
            await self._refresh(older_than=UNKNOWN_KEY_REFETCH_AFTER)
            key = self._keys.get(key_id or "")
        if key is None:
            raise ChannelAuthError("unknown signing key id")
        return key

    async def _refresh(self, *, older_than: float) -> None:
        """Refetch the keys if the last fetch is older than `older_than` seconds."""
        async with self._lock:  # concurrent callers wait for one fetch, then find it fresh
            if self._fetched_at is not None and time.monotonic() - self._fetched_at < older_than:
                return
            try:
                metadata = await self._get_json(self.metadata_url)
                jwks = await self._get_json(str(metadata["jwks_uri"]))
                keys = {
                    str(item["kid"]): SigningKey(
                        public_key=RSAAlgorithm.from_jwk(item),
                        endorsements=tuple(item.get("endorsements") or ()),
                    )
                    for item in jwks["keys"]
                    if item.get("kty") == "RSA" and item.get("kid")
                }
            except (httpx.HTTPError, ValueError, KeyError, TypeError, jwt.InvalidKeyError) as exc:
                log.warning("teams.signing_keys_failed", url=self.metadata_url, error=str(exc))
                if not self._keys:
                    raise SigningKeysUnavailableError("signing keys unavailable") from exc
                self._fetched_at = time.monotonic()  # keep the old keys; retry after the pause
                return
            self._keys = keys
            self._fetched_at = time.monotonic()
            log.info("teams.signing_keys_fetched", url=self.metadata_url, keys=len(keys))

    async def _get_json(self, url: str) -> Any:
        response = await self._http.get(url)
        response.raise_for_status()
        return response.json()


class BotCredentials(AppCredentials):  # type: ignore[misc]  # (the SDK's base is untyped)
    """The bot's connector token, from an OAuth2 client-credentials POST to `token_url`.

    Call `refresh()` before each connector call; without an app id or password (development)
    the connector is called without a token.
    """

    def __init__(
        self, app_id: str, password: str, *, token_url: str, scope: str, http: httpx.AsyncClient
    ) -> None:
        super().__init__(app_id=app_id, oauth_scope=scope)
        self._password = password
        self._token_url = token_url
        self._http = http
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def uses_token(self) -> bool:
        """Whether connector calls carry a bearer token (an app id and password are set)."""
        return bool(self.microsoft_app_id and self._password)

    def _should_set_token(self, session: object) -> bool:
        return self.uses_token

    def get_access_token(self, force_refresh: bool = False) -> str:
        """The cached token (read by the SDK on the event loop, so it never fetches)."""
        if self._token is None or force_refresh:
            raise DeliveryError("no bot token: BotCredentials.refresh() must run first")
        return self._token

    def invalidate(self) -> None:
        """Forget the token (the connector refused it)."""
        self._token = None

    async def refresh(self) -> None:
        """Fetch a token unless the cached one is still good; raises `DeliveryError`."""
        if not self.uses_token:
            return
        async with self._lock:
            if self._token is not None and time.monotonic() < self._renew_at:
                return
            self._token, lifetime = await self._fetch()
            self._renew_at = time.monotonic() + max(lifetime - TOKEN_EARLY_REFRESH, lifetime / 2)

    async def _fetch(self) -> tuple[str, float]:
        form = {
            "grant_type": "client_credentials",
            "client_id": self.microsoft_app_id,
            "client_secret": self._password,
            "scope": self.oauth_scope,
        }
        try:
            response = await self._http.post(self._token_url, data=form)
        except httpx.HTTPError as exc:
            raise DeliveryError(f"token endpoint unreachable: {exc!r}") from exc
        if response.status_code != 200:
            code = _error_code(response)
            log.error("teams.token_refused", status=response.status_code, error=code)
            raise DeliveryError(
                f"token endpoint answered HTTP {response.status_code} ({code})",
                permanent=response.status_code in (400, 401, 403),
            )
        try:
            body = response.json()
            return str(body["access_token"]), float(body.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError) as exc:
            raise DeliveryError("token endpoint answered without an access_token") from exc


class TeamsCredentialsFactory(ServiceClientCredentialsFactory):  # type: ignore[misc]  # (untyped)
    """What the SDK asks about the app: its id (the token audience) and its credentials."""

    def __init__(self, app_id: str, credentials: BotCredentials) -> None:
        self._app_id = app_id
        self._credentials = credentials

    async def is_valid_app_id(self, app_id: object) -> bool:
        """Whether a token's audience is this bot."""
        return (
            bool(self._app_id)
            and isinstance(app_id, str)
            and hmac.compare_digest(app_id.encode(), self._app_id.encode())
        )

    async def is_authentication_disabled(self) -> bool:
        """Never: the channel refuses to start without an app id unless in development mode,
        and development mode does not call the SDK's validation at all."""
        return False

    async def create_credentials(
        self, app_id: str, oauth_scope: str, login_endpoint: str, validate_authority: bool
    ) -> BotCredentials:
        """The bot's own credentials (there is only one app)."""
        return self._credentials


class ActivityAuthenticator:
    """Validates the `Authorization` header of an inbound activity, with the SDK's checks."""

    def __init__(
        self,
        factory: TeamsCredentialsFactory,
        keys: SigningKeys,
        *,
        issuer: str = BOT_FRAMEWORK_ISSUER,
    ) -> None:
        self._keys = keys
        self._issuer = issuer
        # Setting the metadata URL puts the SDK in "parameterized" mode, where every related
        # value comes from this object (a missing issuer would reject every token).
        config = SimpleNamespace(
            TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL=keys.metadata_url,
            TO_BOT_FROM_CHANNEL_TOKEN_ISSUER=issuer,
            TO_CHANNEL_FROM_BOT_OAUTH_SCOPE=BOT_FRAMEWORK_ISSUER,
            VALIDATE_AUTHORITY=True,
        )
        self._sdk = ConfigurationBotFrameworkAuthentication(config, credentials_factory=factory)

    async def authenticate(self, header: str | None, *, channel_id: str, service_url: str) -> None:
        """Return if the header proves the Bot Framework sent this activity to this bot;
        raise `ChannelAuthError` (reason as message), or `SigningKeysUnavailableError`."""
        token = _bearer_token(header)
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError as exc:
            raise ChannelAuthError("malformed token") from exc
        if claims.get("iss") != self._issuer:
            raise ChannelAuthError("wrong issuer")
        # Re-placed on every call: another channel object for the same URL may have put its own.
        JwtTokenExtractor.metadataCache[self._keys.metadata_url] = self._keys
        activity = Activity(channel_id=channel_id, service_url=service_url)
        try:
            await self._sdk.authenticate_request(activity, header)
        except ChannelAuthError:
            raise
        except Exception as exc:  # the SDK raises bare Exception, too (endorsements)
            raise ChannelAuthError(_sdk_reason(exc)) from exc

    def forget_keys(self) -> None:
        """Take the key source out of the SDK's process-wide cache (the channel is closing)."""
        if JwtTokenExtractor.metadataCache.get(self._keys.metadata_url) is self._keys:
            del JwtTokenExtractor.metadataCache[self._keys.metadata_url]


def _bearer_token(header: str | None) -> str:
    if not header or not header.strip():
        raise ChannelAuthError("missing token")
    scheme, _, token = header.strip().partition(" ")
    if scheme != "Bearer" or not token.strip() or " " in token.strip():
        raise ChannelAuthError("malformed Authorization header")
    return token.strip()


def _sdk_reason(exc: Exception) -> str:
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token not yet valid"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "bad token signature"
    if isinstance(exc, jwt.InvalidTokenError):
        return f"invalid token ({exc})"
    message = str(exc)
    for needle, reason in _SDK_REASONS:
        if needle in message:
            return reason
    return f"token rejected ({type(exc).__name__}: {message})"


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error") or "unknown error")
    except (ValueError, AttributeError):
        return "unknown error"
