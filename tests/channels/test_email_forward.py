"""Inline forwards (`read_forward`) and reply quotes (`strip_reply`) on plain text."""

# Localized mail is written in its own script.
# ruff: noqa: RUF001

from __future__ import annotations

import pytest

from channels.email.forward import Mailbox, read_forward
from channels.email.quote import remove_own_texts, strip_reply

GMAIL = """Note on top.

---------- Forwarded message ---------
From: Bob Builder <bob@example.org>
Date: Mon, Feb 3, 2025 at 9:00 AM
Subject: Budget 2025
To: Alice <alice@example.com>, Carol <carol@example.com>
Cc: Dan <dan@example.com>


Body line one.
Body line two.
"""

GERMAN_THUNDERBIRD = """-------- Weitergeleitete Nachricht --------
Betreff: Angebot
Datum: Mon, 3 Feb 2025 09:00:00 +0100
Von: Erika Mustermann <erika@example.de>
An: alice@example.com

Sehr geehrte Damen und Herren,
anbei das Angebot.
"""

NEW_OUTLOOK = """FYI

From: Bob Builder <bob@example.org>
Date: Monday, 3 February 2025 at 09:00
To: Alice <alice@example.com>
Subject: Budget 2025
Body without a blank line.
"""


def test_a_gmail_forward_yields_the_note_and_the_original() -> None:
    found = read_forward(GMAIL, "Fwd: Budget 2025")
    assert found.forwarded
    assert found.message == "Note on top."
    assert found.subject == "Budget 2025"
    assert found.date == "Mon, Feb 3, 2025 at 9:00 AM"
    assert found.sender == Mailbox("bob@example.org", "Bob Builder")
    assert found.to == (
        Mailbox("alice@example.com", "Alice"),
        Mailbox("carol@example.com", "Carol"),
    )
    assert found.cc == (Mailbox("dan@example.com", "Dan"),)
    assert found.body == "Body line one.\nBody line two."


def test_a_localized_forward_without_a_note() -> None:
    found = read_forward(GERMAN_THUNDERBIRD, "Fwd: Angebot")
    assert found.forwarded
    assert found.message is None
    assert found.sender == Mailbox("erika@example.de", "Erika Mustermann")
    assert found.subject == "Angebot"
    assert found.body == "Sehr geehrte Damen und Herren,\nanbei das Angebot."


def test_new_outlook_forwards_need_the_subject_to_say_so() -> None:
    """No separator line: only an "FW:" subject makes the From line a split point."""
    found = read_forward(NEW_OUTLOOK, "FW: Budget 2025")
    assert found.forwarded
    assert (found.message, found.body) == ("FYI", "Body without a blank line.")
    assert not read_forward(NEW_OUTLOOK, "Budget 2025").forwarded


@pytest.mark.parametrize("subject", ["Re: Budget 2025", "AW: Budget 2025", "SV: Budget"])
def test_a_reply_subject_means_no_forward(subject: str) -> None:
    assert not read_forward(GMAIL, subject).forwarded


def test_plain_mail_is_no_forward() -> None:
    found = read_forward("Just a question about the budget.", "Budget")
    assert not found.forwarded
    assert found.body is None


def test_general_quote_stripping_handles_top_posting_in_several_languages() -> None:
    english = "Yes.\n\nOn Mon, 3 Feb 2025 at 09:00, Bob <bob@example.org> wrote:\n> Lunch?\n"
    german = "Ja.\n\nAm 03.02.2025 um 09:00 schrieb Bob <bob@example.org>:\n> Mittag?\n"
    outlook = (
        "Yes.\n\nFrom: Bob <bob@example.org>\nSent: Monday, February 3, 2025 9:00 AM\n"
        "To: Alice <alice@example.com>\nSubject: Lunch\n\nLunch?\n"
    )
    russian = "Да.\n\nОт: Bob <bob@example.org>\nОтправлено: 3 февраля 2025\nКому: Alice\n\nОбед?\n"
    assert [strip_reply(text) for text in (english, german, outlook, russian)] == [
        "Yes.",
        "Ja.",
        "Yes.",
        "Да.",
    ]


def test_signatures_after_the_delimiter_and_mobile_footers_go() -> None:
    assert strip_reply("Sure thing.\n\n-- \nAlice Example\nACME Corp") == "Sure thing."
    assert strip_reply("Sure thing.\n\nSent from my iPhone") == "Sure thing."
    kept = "Sure thing.\n\nSent from my desk, which is nicer than the phone."
    assert strip_reply(kept) == kept


def test_a_mail_that_is_all_quote_keeps_its_text() -> None:
    assert strip_reply("> only a quote\n> nothing else") == "> only a quote\n> nothing else"


def test_own_texts_shorter_than_four_words_are_not_removed() -> None:
    assert remove_own_texts("OK, thanks\nOK, thanks", ["OK, thanks"]) == "OK, thanks\nOK, thanks"
