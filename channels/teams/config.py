"""The Teams channel's config section (`channels.teams`): the credentials are required unless
`insecure_dev_mode` says otherwise."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from primitives.config_types import (
    NonEmptyStr,
    OptionalStr,
    StrictModel,
    is_blank,
    rule_error,
)

_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def _check_file_host(value: str) -> str:
    """A host name, `*.` and a domain below a top-level one, or an IP address: never a URL,
    since the scheme is the gateway's to choose (https; http only to loopback) and any port
    is allowed."""
    host = value.strip().lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host) or (host.startswith("*.") and host.count(".") < 2):
        raise rule_error(
            f"invalid file host {value!r}: write a host name (files.example.com), "
            "*. and a domain (*.example.com) or an IP address, without scheme or port"
        )
    return host


FileHost = Annotated[str, AfterValidator(_check_file_host)]


class TeamsChannelConfig(StrictModel):
    """The Microsoft Teams bot (Bot Framework); inbound JWTs are verified against ``app_id``."""

    enabled: bool = False
    # Declared before the credentials because their rules read it.
    insecure_dev_mode: bool = False
    app_id: str = ""
    app_password: SecretStr = SecretStr("")
    tenant_ids: tuple[NonEmptyStr, ...] = ()
    openid_metadata_url: OptionalStr = None
    oauth_token_url: OptionalStr = None
    # Live replies: streamed in personal chats, a typing indicator elsewhere.
    streaming: bool = True
    # Hosts files may also be fetched from, besides SharePoint/OneDrive and the service URL.
    file_hosts: tuple[FileHost, ...] = ()

    @field_validator("app_id")
    @classmethod
    def _enabled_needs_app_id(cls, value: str, info: ValidationInfo) -> str:
        """The JWT audience check needs the app id; skipping it is an explicit dev choice."""
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and is_blank(value):
            raise rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value

    @field_validator("app_password")
    @classmethod
    def _enabled_needs_app_password(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        """Replies are sent with a token obtained with the app password."""
        if info.data.get("enabled") and not info.data.get("insecure_dev_mode") and is_blank(value):
            raise rule_error(
                "required when the Teams channel is enabled (unless insecure_dev_mode: true)",
            )
        return value
