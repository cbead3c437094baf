"""The channels the gateway can run: one line per channel type, naming its plugin module.

Adding a channel is a subpackage under `channels/` whose `plugin` module defines `PLUGIN` (a
`ChannelPlugin`), plus its line here. Plugin modules are light (their config schema only), so
the gateway imports all of them to build the `channels` config section; a channel's platform
library is imported only when the channel is opened.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from channels.base import ChannelType
from channels.plugin import ChannelPlugin

PLUGIN_MODULES: dict[ChannelType, str] = {
    ChannelType.WEB: "channels.web.plugin",
    ChannelType.SLACK: "channels.slack.plugin",
    ChannelType.TEAMS: "channels.teams.plugin",
    ChannelType.EMAIL: "channels.email.plugin",
}


@cache
def channel_plugins() -> tuple[ChannelPlugin[Any, Any], ...]:
    """Every registered channel's plugin, in registry order."""
    plugins: list[ChannelPlugin[Any, Any]] = []
    for channel_type, module_name in PLUGIN_MODULES.items():
        plugin: ChannelPlugin[Any, Any] = importlib.import_module(module_name).PLUGIN
        if plugin.channel_type is not channel_type:
            raise RuntimeError(f"{module_name} registers {plugin.channel_type}, not {channel_type}")
        plugins.append(plugin)
    return tuple(plugins)


def channel_plugin(channel_type: ChannelType | str) -> ChannelPlugin[Any, Any]:
    """The plugin of one channel type."""
    wanted = ChannelType(channel_type)
    return next(plugin for plugin in channel_plugins() if plugin.channel_type is wanted)
