"""HTML mail bodies as plain text (inscriptis, Apache-2.0), optionally without quoted replies.

Mail clients mark what a reply quotes in HTML, not with ``>``: Gmail's ``gmail_quote``,
``<blockquote>`` (Apple Mail, Thunderbird, Yahoo, mail.ru …), Outlook's ``divRplyFwdMsg`` /
``appendonsend`` markers (everything after them is the quoted message). `html_to_text` with
``drop_quotes`` removes those before converting, so the plain-text quote stripper only has to
deal with what is left (an ``On … wrote:`` line at the end, Outlook header blocks).
"""

from __future__ import annotations

import re
from html import escape

from inscriptis import Inscriptis  # type: ignore[import-untyped]
from inscriptis.model.config import ParserConfig  # type: ignore[import-untyped]
from lxml import etree, html  # type: ignore[import-untyped]

_QUOTE_ELEMENTS = (
    "//blockquote"
    " | //*[contains(@class, 'gmail_quote')]"
    " | //*[contains(@class, 'moz-cite-prefix')]"
    " | //*[contains(@class, 'yahoo_quoted')]"
    " | //*[contains(@class, 'protonmail_quote')]"  # Proton Mail
    " | //*[contains(@class, 'zmail_extra')]"  # Zoho Mail
    " | //*[@data-marker='__QUOTED_TEXT__']"  # Zimbra
    " | //*[@id='mail-editor-reference-message-container']"  # new Outlook, Outlook for iOS
)
# Outlook (web and desktop) marks the start of the quoted message; what follows is quoted.
_QUOTE_STARTS = (
    "//*[@id='divRplyFwdMsg'] | //*[@id='appendonsend'] | //*[@id='OLK_SRC_BODY_SECTION']"
)
_FROM_LINE = re.compile(
    r"(From|De|Von|Van|Da|Od|Fra|Från|От|Від|Lähettäjä|Feladó|Kimden|Expéditeur|Mittente|"
    r"Nadawca|Από|差出人|发件人|寄件者|보낸\s?사람)\s?[:：]",  # noqa: RUF001 (full-width colon)
    re.I,
)
_CONFIG = ParserConfig(display_images=False, display_links=False)


class HtmlError(ValueError):
    """The HTML could not be parsed at all."""


def html_to_text(markup: str, *, drop_quotes: bool = False) -> str:
    """The text of an HTML body; with `drop_quotes`, without what it quotes."""
    tree = _parse(markup)
    if tree is None:
        return ""
    if drop_quotes:
        _drop_quotes(tree)
    try:
        text: str = Inscriptis(tree, _CONFIG).get_text()
    except RecursionError as exc:  # absurdly deep nesting
        raise HtmlError("the HTML is nested too deeply") from exc
    return text


def _parse(markup: str) -> html.HtmlElement | None:
    # lxml refuses str input that declares its own encoding: the text is decoded already.
    markup = markup.strip().replace("\x00", "")
    if markup.startswith("<?xml"):
        markup = markup.split("?>", 1)[-1]
    if not markup:
        return None
    try:
        return html.document_fromstring(markup)
    except (etree.ParserError, ValueError):
        try:
            return html.document_fromstring(f"<pre>{escape(markup)}</pre>")
        except (etree.ParserError, ValueError) as exc:
            raise HtmlError(f"unreadable HTML: {exc}") from exc


def _drop_quotes(tree: html.HtmlElement) -> None:
    for rule in tree.xpath("//hr"):
        # Yahoo, AOL, Comcast: a rule, then the quoted message's From: line.
        following = (rule.tail or "") + "".join(
            sibling.text_content() + (sibling.tail or "") for sibling in rule.itersiblings()
        )
        if _FROM_LINE.match(following[:300].lstrip()):
            for sibling in list(rule.itersiblings()):
                _remove(sibling)
            rule.tail = ""
            _remove(rule)
    for start in tree.xpath(_QUOTE_STARTS):
        for sibling in list(start.itersiblings()):
            _remove(sibling)
        _remove(start)
    for element in tree.xpath(_QUOTE_ELEMENTS):
        _remove(element)


def _remove(element: html.HtmlElement) -> None:
    parent = element.getparent()
    if parent is None:
        return
    # Keep the text that follows the element (its tail), which belongs to the parent.
    tail = element.tail or ""
    previous = element.getprevious()
    if previous is not None:
        previous.tail = (previous.tail or "") + tail
    else:
        parent.text = (parent.text or "") + tail
    parent.remove(element)
