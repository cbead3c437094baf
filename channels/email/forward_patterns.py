"""The regular expressions that recognise forwarded mail in a message body, per mail client.

Ported from the MIT-licensed crisp-oss/email-forward-parser (``lib/parser.js``, Copyright (c)
2021 Crisp IM SAS): the JavaScript patterns are kept as they are (named groups spelled the Python
way), with the client and locale each one comes from, so new clients can be added by comparing
with upstream. Only data lives here; `channels.email.forward` applies it.
"""

# The patterns are localized literals (full-width colons, dotless i) and long by nature.
# ruff: noqa: RUF001, E501

from __future__ import annotations

import re
from collections.abc import Sequence

Patterns = tuple[re.Pattern[str], ...]

M = re.MULTILINE
I = re.IGNORECASE  # noqa: E741 (the JavaScript flag letter, kept for comparison with upstream)


def _compile(patterns: Sequence[str], flags: int) -> Patterns:
    return tuple(re.compile(pattern, flags) for pattern in patterns)


def _header_lines(labels: Sequence[str], flags: int, *, anchored: bool = True) -> Patterns:
    """`Label: value` lines, the value captured. A label written ``*To`` may be bold
    (``*To:*``, HubSpot); one ending in a full-width colon has no other colon (Japanese)."""
    patterns = []
    for label in labels:
        name = label.removeprefix("*")
        if name.endswith("："):
            core = rf"\s*{name}(.+)$"
        elif name != label:
            core = rf"\*?\s*{name}\s?:\*?(.+)$"
        else:
            core = rf"\s*{name}\s?:(.+)$"
        patterns.append(("^" if anchored else "") + core)
    return _compile(patterns, flags)


QUOTE_LINE_BREAK = re.compile(r"^(>+)\s?$", M)  # Apple Mail
QUOTE = re.compile(r"^(>+)\s?", M)  # Apple Mail
FOUR_SPACES = re.compile(r"^(\ {4})\s?", M)  # Outlook 2019

MAILBOX_SEPARATORS = (",", ";")  # Apple Mail, Gmail, Thunderbird / Outlook Live, Yahoo Mail

SUBJECT = _compile(
    [
        r"^Fw:(.*)",  # Outlook Live / 365 (cs, en, hr, hu, sk), Yahoo Mail (all locales)
        r"^VS:(.*)",  # Outlook Live / 365 (da), New Outlook 2019 (da)
        r"^WG:(.*)",  # Outlook Live / 365 (de), New Outlook 2019 (de)
        r"^RV:(.*)",  # Outlook Live / 365 (es), New Outlook 2019 (es)
        r"^TR:(.*)",  # Outlook Live / 365 (fr), New Outlook 2019 (fr)
        r"^I:(.*)",  # Outlook Live / 365 (it), New Outlook 2019 (it)
        r"^FW:(.*)",  # Outlook Live / 365 (nl, pt), New Outlook 2019, Outlook 2019
        r"^Vs:(.*)",  # Outlook Live / 365 (no)
        r"^PD:(.*)",  # Outlook Live / 365 (pl), New Outlook 2019 (pl)
        r"^ENC:(.*)",  # Outlook Live / 365 (pt-br), New Outlook 2019 (pt-br)
        r"^Redir.:(.*)",  # Outlook Live / 365 (ro)
        r"^VB:(.*)",  # Outlook Live / 365 (sv), New Outlook 2019 (sv)
        r"^VL:(.*)",  # New Outlook 2019 (fi)
        r"^Videresend:(.*)",  # New Outlook 2019 (no)
        r"^İLT:(.*)",  # New Outlook 2019 (tr)
        r"^Fwd:(.*)",  # Gmail (all locales), Thunderbird (all locales), Missive (en)
    ],
    M,
)

# The same prefixes in any case, with a space before the colon, after tags that mail gateways
# put in front ("[EXT] FW: …", "FWD: …", "TR : …"); tried when `SUBJECT` finds none.
SUBJECT_LOOSE = re.compile(
    r"^\s*(?:\[[^\]]{1,40}\]\s*)*"
    r"(?:fwd?|wg|vs|rv|tr|i|pd|enc|redir\.|vb|vl|videresend|i̇lt|ilt|doorst)\s?:(.*)",
    I,
)

# Separators that only forwards use (unlike Outlook's reply header blocks, below).
FORWARD_ONLY_SEPARATOR = _compile(
    [
        r"^>?\s*Begin forwarded message\s?:",  # Apple Mail (en)
        r"^>?\s*Začátek přeposílané zprávy\s?:",  # Apple Mail (cs)
        r"^>?\s*Start på videresendt besked\s?:",  # Apple Mail (da)
        r"^>?\s*Anfang der weitergeleiteten Nachricht\s?:",  # Apple Mail (de)
        r"^>?\s*Inicio del mensaje reenviado\s?:",  # Apple Mail (es)
        r"^>?\s*Välitetty viesti alkaa\s?:",  # Apple Mail (fi)
        r"^>?\s*Début du message réexpédié\s?:",  # Apple Mail (fr)
        r"^>?\s*Début du message transféré\s?:",  # Apple Mail iOS (fr)
        r"^>?\s*Započni proslijeđenu poruku\s?:",  # Apple Mail (hr)
        r"^>?\s*Továbbított levél kezdete\s?:",  # Apple Mail (hu)
        r"^>?\s*Inizio messaggio inoltrato\s?:",  # Apple Mail (it)
        r"^>?\s*Begin doorgestuurd bericht\s?:",  # Apple Mail (nl)
        r"^>?\s*Videresendt melding\s?:",  # Apple Mail (no)
        r"^>?\s*Początek przekazywanej wiadomości\s?:",  # Apple Mail (pl)
        r"^>?\s*Início da mensagem reencaminhada\s?:",  # Apple Mail (pt)
        r"^>?\s*Início da mensagem encaminhada\s?:",  # Apple Mail (pt-br)
        r"^>?\s*Începe mesajul redirecționat\s?:",  # Apple Mail (ro)
        r"^>?\s*Начало переадресованного сообщения\s?:",  # Apple Mail (ru)
        r"^>?\s*Začiatok preposlanej správy\s?:",  # Apple Mail (sk)
        r"^>?\s*Vidarebefordrat mejl\s?:",  # Apple Mail (sv)
        r"^>?\s*İleti başlangıcı\s?:",  # Apple Mail (tr)
        r"^>?\s*Початок листа, що пересилається\s?:",  # Apple Mail (uk)
        r"^\s*-{8,10}\s*Forwarded message\s*-{8,10}\s*",  # Gmail, Missive, HubSpot (en)
        r"^\s?Forwarded message:",  # MailMate (en)
        r"^\s*-{5,8} Přeposlaná zpráva -{5,8}\s*",  # Yahoo Mail (cs), Thunderbird (cs)
        r"^\s*-{5,8} Videresendt meddelelse -{5,8}\s*",  # Yahoo Mail (da), Thunderbird (da)
        r"^\s*-{5,10} Weitergeleitete Nachricht -{5,10}\s*",  # Yahoo Mail (de), Thunderbird (de)
        r"^\s*-{5,8} Forwarded Message -{5,8}\s*",  # Yahoo Mail (en), Thunderbird (en)
        r"^\s*-{5,10} Mensaje reenviado -{5,10}\s*",  # Yahoo Mail (es), Thunderbird (es)
        r"^\s*-{5,10} Edelleenlähetetty viesti -{5,10}\s*",  # Yahoo Mail (fi)
        r"^\s*-{5} Message transmis -{5}\s*",  # Yahoo Mail (fr)
        r"^\s*-{5,8} Továbbított üzenet -{5,8}\s*",  # Yahoo Mail (hu), Thunderbird (hu)
        r"^\s*-{5,10} Messaggio inoltrato -{5,10}\s*",  # Yahoo Mail (it)
        r"^\s*-{5,10} Doorgestuurd bericht -{5,10}\s*",  # Yahoo Mail (nl), Thunderbird (nl)
        r"^\s*-{5,8} Videresendt melding -{5,8}\s*",  # Yahoo Mail (no), Thunderbird (no)
        r"^\s*-{5} Przekazana wiadomość -{5}\s*",  # Yahoo Mail (pl)
        r"^\s*-{5,8} Mensagem reencaminhada -{5,8}\s*",  # Yahoo Mail (pt), Thunderbird (pt)
        r"^\s*-{5,10} Mensagem encaminhada -{5,10}\s*",  # Yahoo Mail (pt-br), Thunderbird (pt-br)
        r"^\s*-{5,8} Mesaj redirecționat -{5,8}\s*",  # Yahoo Mail (ro)
        r"^\s*-{5} Пересылаемое сообщение -{5}\s*",  # Yahoo Mail (ru)
        r"^\s*-{5} Preposlaná správa -{5}\s*",  # Yahoo Mail (sk)
        r"^\s*-{5,10} Vidarebefordrat meddelande -{5,10}\s*",  # Yahoo Mail (sv), Thunderbird (sv)
        r"^\s*-{5} İletilmiş Mesaj -{5}\s*",  # Yahoo Mail (tr)
        r"^\s*-{5} Перенаправлене повідомлення -{5}\s*",  # Yahoo Mail (uk)
        r"^\s*-{8} Välitetty viesti \/ Fwd.Msg -{8}\s*",  # Thunderbird (fi)
        r"^\s*-{8,10} Message transféré -{8,10}\s*",  # Thunderbird (fr)
        r"^\s*-{8} Proslijeđena poruka -{8}\s*",  # Thunderbird (hr)
        r"^\s*-{8} Messaggio Inoltrato -{8}\s*",  # Thunderbird (it)
        r"^\s*-{3} Treść przekazanej wiadomości -{3}\s*",  # Thunderbird (pl)
        r"^\s*-{8} Перенаправленное сообщение -{8}\s*",  # Thunderbird (ru)
        r"^\s*-{8} Preposlaná správa --- Forwarded Message -{8}\s*",  # Thunderbird (sk)
        r"^\s*-{8} İletilen İleti -{8}\s*",  # Thunderbird (tr)
        r"^\s*-{8} Переслане повідомлення -{8}\s*",  # Thunderbird (uk)
        r"^\s*-{9,10} メッセージを転送 -{9,10}\s*",  # HubSpot (ja)
        r"^\s*-{9,10} Wiadomość przesłana dalej -{9,10}\s*",  # HubSpot (pl)
        r"^>?\s*-{10} Original Message -{10}\s*",  # IONOS by 1 & 1 (en)
    ],
    M,
)

# Outlook separators: the same lines head a quoted reply, so they count only when the subject
# says the message is a forward (or no subject is known, as in upstream's tests).
OUTLOOK_SEPARATOR = _compile(
    [
        r"^\s*_{32}\s*$",  # Outlook Live / 365 (all locales)
        r"^\s?Dne\s?.+\,\s?.+\s*[\[|<].+[\]|>]\s?napsal\(a\)\s?:",  # Outlook 2019 (cz)
        r"^\s?D.\s?.+\s?skrev\s?\".+\"\s*[\[|<].+[\]|>]\s?:",  # Outlook 2019 (da)
        r"^\s?Am\s?.+\s?schrieb\s?\".+\"\s*[\[|<].+[\]|>]\s?:",  # Outlook 2019 (de)
        r"^\s?On\s?.+\,\s?\".+\"\s*[\[|<].+[\]|>]\s?wrote\s?:",  # Outlook 2019 (en)
        r"^\s?El\s?.+\,\s?\".+\"\s*[\[|<].+[\]|>]\s?escribió\s?:",  # Outlook 2019 (es)
        r"^\s?Le\s?.+\,\s?«.+»\s*[\[|<].+[\]|>]\s?a écrit\s?:",  # Outlook 2019 (fr)
        r"^\s?.+\s*[\[|<].+[\]|>]\s?kirjoitti\s?.+\s?:",  # Outlook 2019 (fi)
        r"^\s?.+\s?időpontban\s?.+\s*[\[|<|(].+[\]|>|)]\s?ezt írta\s?:",  # Outlook 2019 (hu)
        r"^\s?Il giorno\s?.+\s?\".+\"\s*[\[|<].+[\]|>]\s?ha scritto\s?:",  # Outlook 2019 (it)
        r"^\s?Op\s?.+\s?heeft\s?.+\s*[\[|<].+[\]|>]\s?geschreven\s?:",  # Outlook 2019 (nl)
        r"^\s?.+\s*[\[|<].+[\]|>]\s?skrev følgende den\s?.+\s?:",  # Outlook 2019 (no)
        r"^\s?Dnia\s?.+\s?„.+”\s*[\[|<].+[\]|>]\s?napisał\s?:",  # Outlook 2019 (pl)
        r"^\s?Em\s?.+\,\s?\".+\"\s*[\[|<].+[\]|>]\s?escreveu\s?:",  # Outlook 2019 (pt)
        r"^\s?.+\s?пользователь\s?\".+\"\s*[\[|<].+[\]|>]\s?написал\s?:",  # Outlook 2019 (ru)
        r"^\s?.+\s?používateľ\s?.+\s*\([\[|<].+[\]|>]\)\s?napísal\s?:",  # Outlook 2019 (sk)
        r"^\s?Den\s?.+\s?skrev\s?\".+\"\s*[\[|<].+[\]|>]\s?följande\s?:",  # Outlook 2019 (sv)
        r"^\s?\".+\"\s*[\[|<].+[\]|>]\,\s?.+\s?tarihinde şunu yazdı\s?:",  # Outlook 2019 (tr)
    ],
    M,
)

SEPARATOR_WITH_INFORMATION = _compile(
    [
        # Outlook 2019 (cz)
        r"^\s?Dne\s?(?P<date>.+)\,\s?(?P<from_name>.+)\s*[\[|<](?P<from_address>.+)[\]|>]\s?napsal\(a\)\s?:",
        # Outlook 2019 (da)
        r"^\s?D.\s?(?P<date>.+)\s?skrev\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?:",
        # Outlook 2019 (de)
        r"^\s?Am\s?(?P<date>.+)\s?schrieb\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?:",
        # Outlook 2019 (en)
        r"^\s?On\s?(?P<date>.+)\,\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?wrote\s?:",
        # Outlook 2019 (es)
        r"^\s?El\s?(?P<date>.+)\,\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?escribió\s?:",
        # Outlook 2019 (fr)
        r"^\s?Le\s?(?P<date>.+)\,\s?«(?P<from_name>.+)»\s*[\[|<](?P<from_address>.+)[\]|>]\s?a écrit\s?:",
        # Outlook 2019 (fi)
        r"^\s?(?P<from_name>.+)\s*[\[|<](?P<from_address>.+)[\]|>]\s?kirjoitti\s?(?P<date>.+)\s?:",
        # Outlook 2019 (hu)
        r"^\s?(?P<date>.+)\s?időpontban\s?(?P<from_name>.+)\s*[\[|<|(](?P<from_address>.+)[\]|>|)]\s?ezt írta\s?:",
        # Outlook 2019 (it)
        r"^\s?Il giorno\s?(?P<date>.+)\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?ha scritto\s?:",
        # Outlook 2019 (nl)
        r"^\s?Op\s?(?P<date>.+)\s?heeft\s?(?P<from_name>.+)\s*[\[|<](?P<from_address>.+)[\]|>]\s?geschreven\s?:",
        # Outlook 2019 (no)
        r"^\s?(?P<from_name>.+)\s*[\[|<](?P<from_address>.+)[\]|>]\s?skrev følgende den\s?(?P<date>.+)\s?:",
        # Outlook 2019 (pl)
        r"^\s?Dnia\s?(?P<date>.+)\s?„(?P<from_name>.+)”\s*[\[|<](?P<from_address>.+)[\]|>]\s?napisał\s?:",
        # Outlook 2019 (pt)
        r"^\s?Em\s?(?P<date>.+)\,\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?escreveu\s?:",
        # Outlook 2019 (ru)
        r"^\s?(?P<date>.+)\s?пользователь\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?написал\s?:",
        # Outlook 2019 (sk)
        r"^\s?(?P<date>.+)\s?používateľ\s?(?P<from_name>.+)\s*\([\[|<](?P<from_address>.+)[\]|>]\)\s?napísal\s?:",
        # Outlook 2019 (sv)
        r"^\s?Den\s?(?P<date>.+)\s?skrev\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\s?följande\s?:",
        # Outlook 2019 (tr)
        r"^\s?\"(?P<from_name>.+)\"\s*[\[|<](?P<from_address>.+)[\]|>]\,\s?(?P<date>.+)\s?tarihinde şunu yazdı\s?:",
    ],
    M,
)

ORIGINAL_SUBJECT = _compile(
    [
        r"^\*?Subject\s?:\*?(.+)",  # Apple Mail (en), Gmail, Outlook Live / 365, Thunderbird, Missive
        r"^Předmět\s?:(.+)",  # cs
        r"^Emne\s?:(.+)",  # da, no
        r"^Betreff\s?:(.+)",  # de
        r"^Asunto\s?:(.+)",  # es
        r"^Aihe\s?:(.+)",  # fi
        r"^Objet\s?:(.+)",  # fr
        r"^Predmet\s?:(.+)",  # hr, sk
        r"^Tárgy\s?:(.+)",  # hu
        r"^Oggetto\s?:(.+)",  # it
        r"^Onderwerp\s?:(.+)",  # nl
        r"^Temat\s?:(.+)",  # pl
        r"^Assunto\s?:(.+)",  # pt, pt-br
        r"^Subiectul\s?:(.+)",  # ro
        r"^Тема\s?:(.+)",  # ru, uk
        r"^Ämne\s?:(.+)",  # sv
        r"^Konu\s?:(.+)",  # tr
        r"^Sujet\s?:(.+)",  # Thunderbird (fr)
        r"^Naslov\s?:(.+)",  # Thunderbird (hr)
        r"^件名：(.+)",  # HubSpot (ja)
    ],
    M | I,
)

ORIGINAL_SUBJECT_LAX = _compile(
    [
        r"Subject\s?:(.+)",  # Yahoo Mail (en)
        r"Emne\s?:(.+)",  # Yahoo Mail (da, no)
        r"Předmět\s?:(.+)",  # Yahoo Mail (cs)
        r"Betreff\s?:(.+)",  # Yahoo Mail (de)
        r"Asunto\s?:(.+)",  # Yahoo Mail (es)
        r"Aihe\s?:(.+)",  # Yahoo Mail (fi)
        r"Objet\s?:(.+)",  # Yahoo Mail (fr)
        r"Tárgy\s?:(.+)",  # Yahoo Mail (hu)
        r"Oggetto\s?:(.+)",  # Yahoo Mail (it)
        r"Onderwerp\s?:(.+)",  # Yahoo Mail (nl)
        r"Assunto\s?:?(.+)",  # Yahoo Mail (pt, pt-br)
        r"Temat\s?:(.+)",  # Yahoo Mail (pl)
        r"Subiect\s?:(.+)",  # Yahoo Mail (ro)
        r"Тема\s?:(.+)",  # Yahoo Mail (ru, uk)
        r"Predmet\s?:(.+)",  # Yahoo Mail (sk)
        r"Ämne\s?:(.+)",  # Yahoo Mail (sv)
        r"Konu\s?:(.+)",  # Yahoo Mail (tr)
    ],
    I,
)

ORIGINAL_FROM = _compile(
    [
        r"^(\*?\s*From\s?:\*?(.+))$",  # Apple Mail (en), Outlook Live / 365, Thunderbird, Missive
        r"^(\s*Od\s?:(.+))$",  # cs, pl, sk
        r"^(\s*Fra\s?:(.+))$",  # da, no
        r"^(\s*Von\s?:(.+))$",  # de
        r"^(\s*De\s?:(.+))$",  # es, fr, pt, pt-br
        r"^(\s*Lähettäjä\s?:(.+))$",  # fi
        r"^(\s*Šalje\s?:(.+))$",  # hr
        r"^(\s*Feladó\s?:(.+))$",  # hu
        r"^(\s*Da\s?:(.+))$",  # it
        r"^(\s*Van\s?:(.+))$",  # nl
        r"^(\s*Expeditorul\s?:(.+))$",  # ro
        r"^(\s*Отправитель\s?:(.+))$",  # ru
        r"^(\s*Från\s?:(.+))$",  # sv
        r"^(\s*Kimden\s?:(.+))$",  # tr
        r"^(\s*Від кого\s?:(.+))$",  # Apple Mail (uk)
        r"^(\s*Saatja\s?:(.+))$",  # Gmail (et)
        r"^(\s*De la\s?:(.+))$",  # Gmail (ro)
        r"^(\s*Gönderen\s?:(.+))$",  # Gmail (tr)
        r"^(\s*От\s?:(.+))$",  # ru
        r"^(\s*Від\s?:(.+))$",  # Gmail (uk), Thunderbird (uk)
        r"^(\s*Mittente\s?:(.+))$",  # Thunderbird (it)
        r"^(\s*Nadawca\s?:(.+))$",  # Thunderbird (pl)
        r"^(\s*de la\s?:(.+))$",  # Thunderbird (ro)
        r"^(\s*送信元：(.+))$",  # HubSpot (ja)
    ],
    M,
)

ORIGINAL_FROM_LAX = _compile(
    [
        rf"(\s*{label}\s?:(.+?)\s?\n?\s*[\[|<](.+?)[\]|>])"
        for label in (
            "From",  # Yahoo Mail (en)
            "Od",  # cs, pl, sk
            "Fra",  # da, no
            "Von",  # de
            "De",  # es, fr, pt, pt-br
            "Lähettäjä",  # fi
            "Feladó",  # hu
            "Da",  # it
            "Van",  # nl
            "De la",  # ro
            "От",  # ru
            "Från",  # sv
            "Kimden",  # tr
            "Від",  # uk
        )
    ],
    0,
)

ORIGINAL_TO = _header_lines(
    [
        "*To",  # Apple Mail (en), Gmail, Outlook Live / 365, Thunderbird, Missive, HubSpot
        "Komu",  # cs, sk
        "Til",  # da, no
        "An",  # de
        "Para",  # es, pt, pt-br
        "Vastaanottaja",  # fi
        "À",  # fr
        "Prima",  # hr
        "Címzett",  # hu
        "A",  # it
        "Aan",  # nl
        "Do",  # pl
        "Destinatarul",  # ro
        "Кому",  # ru, uk
        "Pre",  # sk
        "Till",  # sv
        "Kime",  # tr
        "Pour",  # Thunderbird (fr)
        "Adresat",  # Thunderbird (pl)
        "送信先：",  # HubSpot (ja)
    ],
    M,
)

ORIGINAL_TO_LAX = _header_lines(
    [
        "To",  # Yahoo Mail (en)
        "Komu",  # cs, sk
        "Til",  # da, no, sv
        "An",  # de
        "Para",  # es, pt, pt-br
        "Vastaanottaja",  # fi
        "À",  # fr
        "Címzett",  # hu
        "A",  # it
        "Aan",  # nl
        "Do",  # pl
        "Către",  # ro, Thunderbird (ro)
        "Кому",  # ru, uk
        "Till",  # sv
        "Kime",  # tr
    ],
    M,
    anchored=False,
)

ORIGINAL_REPLY_TO = _header_lines(
    [
        "Reply-To",  # Apple Mail (en)
        "Odgovori na",  # hr
        "Odpověď na",  # cs
        "Svar til",  # da, no
        "Antwoord aan",  # nl
        "Vastaus",  # fi
        "Répondre à",  # fr
        "Antwort an",  # de
        "Válaszcím",  # hu
        "Rispondi a",  # it
        "Odpowiedź-do",  # pl
        "Responder A",  # pt
        "Responder a",  # pt-br, es
        "Răspuns către",  # ro
        "Ответ-Кому",  # ru
        "Odpovedať-Pre",  # sk
        "Svara till",  # sv
        "Yanıt Adresi",  # tr
        "Кому відповісти",  # uk
    ],
    M,
)

ORIGINAL_CC = _header_lines(
    [
        "*Cc",  # Apple Mail, Gmail, Outlook Live / 365, New Outlook 2019, Missive, HubSpot
        "CC",  # New Outlook 2019 (es, nl, pt), Thunderbird
        "Kopie",  # cs, de, nl
        "Kopio",  # fi, New Outlook 2019 (es)
        "Másolat",  # hu
        "Kopi",  # no
        "Dw",  # pl
        "Копия",  # ru
        "Kopia",  # sv, Thunderbird (pl)
        "Bilgi",  # tr
        "Копія",  # uk
        "Másolatot kap",  # New Outlook 2019 (hu)
        "Kópia",  # sk
        "DW",  # New Outlook 2019 (pl)
        r"Kopie \(CC\)",  # Thunderbird (de)
        "Copie à",  # Thunderbird (fr)
        "CC：",  # HubSpot (ja)
    ],
    M,
)

ORIGINAL_CC_LAX = _compile(
    [
        r"\s*Cc\s?:(.+)$",  # Yahoo Mail (da, en, it, nl, pt, pt-br, ro, tr)
        r"\s*CC\s?:(.+)$",  # Yahoo Mail (de, es)
        r"\s*Kopie\s?:(.+)$",  # cs
        r"\s*Kopio\s?:(.+)$",  # fi
        r"\s*Másolat\s?:(.+)$",  # hu
        r"\s*Kopi\s?:(.+)$",  # no
        r"\s*Dw\s?(.+)$",  # pl (sic: no colon upstream)
        r"\s*Копия\s?:(.+)$",  # ru
        r"\s*Kópia\s?:(.+)$",  # sk
        r"\s*Kopia\s?:(.+)$",  # sv
        r"\s*Копія\s?:(.+)$",  # uk
    ],
    M,
)

ORIGINAL_DATE = _header_lines(
    [
        "Date",  # Apple Mail (en, fr), Gmail, New Outlook 2019, Thunderbird, Missive
        "Datum",  # cs, de, hr, nl, sv
        "Dato",  # da, no
        "Envoyé",  # New Outlook 2019 (fr)
        "Fecha",  # es
        "Päivämäärä",  # fi
        "Dátum",  # hu, sk
        "Data",  # it, pl, pt, pt-br
        "Dată",  # ro
        "Дата",  # ru, uk
        "Tarih",  # tr
        "*Sent",  # Outlook Live / 365 (all locales)
        "Päiväys",  # Thunderbird (fi)
        "日付：",  # HubSpot (ja)
    ],
    M,
)

ORIGINAL_DATE_LAX = _header_lines(
    [
        "Datum",  # Yahoo Mail (cs)
        "Sendt",  # da, no
        "Gesendet",  # de
        "Sent",  # en
        "Enviado",  # es, pt, pt-br
        "Envoyé",  # fr
        "Lähetetty",  # fi
        "Elküldve",  # hu
        "Inviato",  # it
        "Verzonden",  # nl
        "Wysłano",  # pl
        "Trimis",  # ro
        "Отправлено",  # ru
        "Odoslané",  # sk
        "Skickat",  # sv
        "Gönderilen",  # tr
        "Відправлено",  # uk
    ],
    M,
    anchored=False,
)

MAILBOX = _compile(
    [
        r"^\s?\n?\s*<.+?<mailto\:(.+?)>>",  # "<a@b<mailto:a@b>>"
        r"^(.+?)\s?\n?\s*<.+?<mailto\:(.+?)>>",  # "Name <a@b<mailto:a@b>>"
        r"^(.+?)\s?\n?\s*[\[|<]mailto\:(.+?)[\]|>]",  # "Name <mailto:a@b>", "Name [mailto:a@b]"
        r"^\'(.+?)\'\s?\n?\s*[\[|<](.+?)[\]|>]",  # "'Name' <a@b>"
        r"^\"\'(.+?)\'\"\s?\n?\s*[\[|<](.+?)[\]|>]",  # "\"'Name'\" <a@b>"
        r"^\"(.+?)\"\s?\n?\s*[\[|<](.+?)[\]|>]",  # "\"Name\" <a@b>"
        r"^([^,;]+?)\s?\n?\s*[\[|<](.+?)[\]|>]",  # "Name <a@b>", "Name [a@b]"
        r"^(.?)\s?\n?\s*[\[|<](.+?)[\]|>]",  # "<a@b>"
        r"^([^\s@]+@[^\s@]+\.[^\s@,]+)",  # "a@b"
        r"^([^;].+?)\s?\n?\s*[\[|<](.+?)[\]|>]",  # "Name, With Comma <a@b>"
    ],
    0,
)

MAILBOX_ADDRESS = re.compile(r"^(([^\s@]+)@([^\s@]+)\.([^\s@]+))$")
