"""What a `SlackChannel` under test is given in place of the gateway: an inbox that keeps what
it accepts (or fails), and a thread directory that knows no threads."""

from __future__ import annotations

from channels.base import AcceptResult, ChannelMessage


class RecordingInbox:
    def __init__(self, error: Exception | None = None) -> None:
        self.messages: list[ChannelMessage] = []
        self.error = error

    async def accept(self, message: ChannelMessage) -> AcceptResult:
        if self.error is not None:
            raise self.error
        self.messages.append(message)
        return AcceptResult(accepted=True, message_id=message.message_id)


class NoThreads:
    async def has_thread(self, channel_id: str, thread_id: str) -> bool:
        return False
