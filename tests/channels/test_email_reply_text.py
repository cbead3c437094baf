"""The reply text of mail as clients write it in many languages: only what the person wrote
reaches the assistant (no quoted history, header block, client signature or invisible
character), answers written inside a quote survive, and forwards stay forwards.

Every entry of the tables in `channels.email.reply_patterns` is exercised by one of these mails
(the last tests check that).
"""

# Real-looking mail in many languages: long localized lines, full-width colons.
# ruff: noqa: E501, RUF001

from __future__ import annotations

import re
import textwrap
from email.message import EmailMessage

import pytest

from channels.email import reply_patterns as rp
from channels.email.parse import parse_email
from channels.email.quote import strip_reply
from channels.email.signature import is_client_line
from tests.channels.email_mail import mail

QUOTE = "> Could you send me the figures for the first quarter?\n> Thanks, Bob\n"
HISTORY = "Could you send me the figures for the first quarter?\n\nThanks, Bob\n"
REPLY = "Here are the figures: 12,400 in January, 13,100 in February."

# (id, the text between the reply and the quoted lines, whether history is ">"-quoted)
ATTRIBUTIONS = [
    ("en-gmail", "On Mon, Mar 3, 2025 at 2:20 PM Bob Smith <bob@example.com> wrote:"),
    (
        "fr-ios-no-break-spaces",
        "Le 3 mars 2025 à 14:20, Bob Smith <bob@example.com> a\u00a0écrit\u202f:",
    ),
    (
        "de-open-xchange",
        "Hans Müller <hans@example.com> hat am 3. März 2025 um 14:20 geschrieben:",
    ),
    ("ja-apple", "2025/03/03 14:20、Bob Smith <bob@example.com>のメール:"),
    ("ko-apple", "2025. 3. 3. 오후 2:20, Bob Smith <bob@example.com> 작성:"),
    (
        "en-gmail-wrapped",
        "On Mon, Mar 3, 2025 at 2:20 PM Bob Smith-Worthington <\n"
        "bob.smith-worthington@example.com> wrote:",
    ),
    ("en-mutt", "* Bob Smith <bob@example.com> [2025-03-03 14:20]:"),
    ("en-evolution", "On Mon, 2025-03-03 at 14:20 +0100, Bob Smith writes:"),
    ("fr-gmail", "Le lun. 3 mars 2025 à 14:20, Bob Smith <bob@example.com> a écrit :"),
    (
        "fr-gmail-wrapped",
        "Le lun. 3 mars 2025 à 14:20, Jean-Philippe Dupont-Lefebvre <\n"
        "jean-philippe.dupont@example.com> a écrit :",
    ),
    (
        "fr-apple-wrapped-verb",
        "Le 3 mars 2025 à 14:20, Jean-Philippe Dupont <jean-philippe.dupont@example.com>\n"
        "a écrit :",
    ),
    ("fr-apple-no-address", "Le 3 mars 2025 à 14:20, Jean Dupont a écrit :"),
    ("de-gmail", "Am Mo., 3. März 2025 um 14:20 Uhr schrieb Bob Smith <bob@example.com>:"),
    (
        "de-gmail-wrapped",
        "Am Mo., 3. März 2025 um 14:20 Uhr schrieb Hans-Jürgen Müller-Lüdenscheidt <\n"
        "hans-juergen.mueller@example.com>:",
    ),
    (
        "de-gmx-schrieb-am",
        "Hans Müller <hans.mueller@example.com> schrieb am Mo., 3. März 2025,\n14:20:",
    ),
    ("de-apple", "Am 03.03.2025 um 14:20 schrieb Hans Müller <hans@example.com>:"),
    (
        "de-name-wrapped",
        "Am Montag, 3. März 2025 um 14:20:33 MEZ schrieb Hans-Jürgen\n"
        "Müller-Lüdenscheidt <hans@example.com>:",
    ),
    ("nl-gmail", "Op ma 3 mrt 2025 om 14:20 schreef Jan de Vries <jan@example.com>:"),
    (
        "nl-gmail-wrapped",
        "Op ma 3 mrt 2025 om 14:20 schreef Jan-Willem van der Berg-Hoogendijk <\n"
        "jan-willem.vanderberg@example.com>:",
    ),
    (
        "nl-outlook",
        "Op 3 mrt. 2025 om 14:20 heeft Jan de Vries <jan@example.com> het volgende geschreven:",
    ),
    ("es-gmail", "El lun, 3 mar 2025 a las 14:20, Juan Pérez (<juan@example.com>) escribió:"),
    (
        "es-gmail-wrapped",
        "El lun, 3 mar 2025 a las 14:20, Juan Carlos Pérez de la Fuente (<\n"
        "juancarlos.perez@example.com>) escribió:",
    ),
    ("pt-gmail", "Em seg., 3 de mar. de 2025 às 14:20, João Silva <joao@example.com> escreveu:"),
    (
        "it-gmail-three-lines",
        "Il giorno lun 3 mar 2025 alle ore 14:20 Giovanni Battista Maria\n"
        "Rossi-Bianchi <giovanni.battista.rossi-bianchi@\n"
        "example.com> ha scritto:",
    ),
    (
        "it-gmail",
        "Il giorno lun 3 mar 2025 alle ore 14:20 Mario Rossi <mario@example.com> ha scritto:",
    ),
    ("it-libero", "Mario Rossi <mario@example.com> scrisse il 03/03/2025 14:20:"),
    ("sv-gmail", "Den mån 3 mars 2025 kl 14:20 skrev Sven Svensson <sven@example.com>:"),
    ("da-gmail", "Den man. 3. mar. 2025 kl. 14.20 skrev Søren Hansen <soren@example.com>:"),
    ("fi-gmail", "ma 3. maalisk. 2025 klo 14.20 Matti Virtanen (matti@example.com) kirjoitti:"),
    ("pl-gmail", "pon., 3 mar 2025 o 14:20 Jan Kowalski <jan@example.com> napisał(a):"),
    ("pl-thunderbird", "W dniu 3.03.2025 o 14:20, Jan Kowalski pisze:\n"),
    ("cs-gmail", "po 3. 3. 2025 v 14:20 odesílatel Jan Novák <jan@example.com> napsal:"),
    ("sk-gmail", "po 3. 3. 2025 o 14:20 Ján Novák <jan@example.com> napísal(a):"),
    ("hr-gmail", "pon, 3. ožu 2025. u 14:20 Ivan Horvat <ivan@example.com> napisao je:"),
    ("ru-gmail", "пн, 3 мар. 2025 г. в 14:20, Иван Петров <ivan@example.com>:"),
    ("ru-yandex", '03.03.2025, 14:20, "Иван Петров" <ivan@example.com>:'),
    ("ru-mailru", "Понедельник, 3 марта 2025, 14:20 +03:00 от Иван Петров <ivan@example.com>:"),
    ("ru-thunderbird", "03.03.2025 14:20, Иван Петров пишет:"),
    ("ru-outlook", "3 марта 2025 г., в 14:20, Иван Петров <ivan@example.com> написал:"),
    ("uk-ukrnet", '30 серп. 2016 р. 20:45 "Arpit" <arpit@example.com> пише:'),
    ("en-name-only", "Bob Smith wrote:"),
    ("en-via-list", "bob via Example Forum wrote:"),
    ("android-dashes", "---- John Smith wrote ----"),
    ("en-zoho", "---- On Tue, 22 Dec 2015 14:17:36 +0530 Bob Smith<bob@example.com> wrote ----"),
    ("zh-gmail-old", "2013/10/2 Bob Smith <bob@example.com>"),
    ("uk-gmail", "пн, 3 бер. 2025 р. о 14:20 Іван Петренко <ivan@example.com> написав:"),
    ("bg-gmail", "пн, 3.03.2025 г. в 14:20 Иван Петров <ivan@example.com> написа:"),
    ("tr-gmail", "Ali Yılmaz <ali@example.com>, 3 Mar 2025 Pzt, 14:20 tarihinde şunu yazdı:"),
    ("hu-gmail", "Kovács János <janos@example.com> ezt írta (időpont: 2025. márc. 3., H, 14:20):"),
    ("ro-gmail", "Ion Popescu <ion@example.com> a scris (luni, 3 mar. 2025, 14:20):"),
    ("el-gmail", "Στις Δευ 3 Μαρ 2025 στις 2:20 μ.μ., ο/η Γιώργος <giorgos@example.com> έγραψε:"),
    (
        "ca-gmail",
        "El dl., 3 de març 2025 a les 14:20, Jordi Puig (<jordi@example.com>) va escriure:",
    ),
    ("lt-gmail", "2025-03-03, pr, 14:20 Jonas Jonaitis <jonas@example.com> rašė:"),
    (
        "lv-gmail",
        "pirmd., 2025. g. 3. marts, plkst. 14:20 — lietotājs Jānis <janis@example.com> rakstīja:",
    ),
    ("et-gmail", "E, 3. märts 2025 kell 14:20 kirjutas Mari Tamm <mari@example.com>:"),
    ("he-gmail", "בתאריך יום ב׳, 3 במרץ 2025 ב-14:20 מאת דוד <david@example.com>\u200f כתב:"),
    ("ar-gmail", "في الاثنين، 3 مارس 2025 في 2:20 م كتب أحمد <ahmed@example.com>:"),
    ("vi-gmail", "Vào Th 2, 3 thg 3, 2025 vào lúc 14:20 Nguyễn Văn A <a@example.com> đã viết:"),
    ("id-gmail", "Pada tanggal Sen, 3 Mar 2025 pukul 14.20 Budi <budi@example.com> menulis:"),
    ("zh-gmail", "Bob Smith <bob@example.com> 于2025年3月3日周一 14:20写道："),
    ("zh-tw-gmail", "Bob Smith <bob@example.com> 於 2025年3月3日 週一 下午2:20寫道："),
    ("ja-gmail", "2025年3月3日(月) 14:20 Bob Smith <bob@example.com>:"),
    ("ko-gmail", "2025년 3월 3일 (월) 오후 2:20, Bob Smith <bob@example.com>님이 작성:"),
    ("gmail-gmt", "2016-03-03 17:21 GMT+01:00 Bob Smith <bob@example.com>:"),
    ("gmail-gmt-wrapped", "2016-03-03 17:21 GMT+01:00 Bob Smith-Worthington <\nbob@example.com>:"),
]


@pytest.mark.parametrize(
    ("attribution"), [a for _, a in ATTRIBUTIONS], ids=[i for i, _ in ATTRIBUTIONS]
)
def test_an_attribution_over_quoted_lines_goes_with_them(attribution: str) -> None:
    body = f"{REPLY}\n\n{attribution}\n\n{QUOTE}"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


# Without a date or an address, "… wrote:" may be the person's own sentence: it goes only
# over quoted lines.
NAME_ONLY = {"en-name-only", "en-via-list", "android-dashes"}
NAME_ONLY_LINES = {a for i, a in ATTRIBUTIONS if i in NAME_ONLY}


@pytest.mark.parametrize(
    ("attribution"),
    [a for i, a in ATTRIBUTIONS if i not in NAME_ONLY],
    ids=[i for i, _ in ATTRIBUTIONS if i not in NAME_ONLY],
)
def test_an_attribution_over_unquoted_history_cuts_it(attribution: str) -> None:
    body = f"{REPLY}\n\n{attribution}\n\n{HISTORY}"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


@pytest.mark.parametrize(
    "attribution",
    [a for i, a in ATTRIBUTIONS if not a.startswith("-")],
    ids=[i for i, a in ATTRIBUTIONS if not a.startswith("-")],
)
def test_an_attribution_wrapped_at_any_width_goes(attribution: str) -> None:
    """Clients wrap long attributions wherever the width ends, over up to three lines."""
    one_line = " ".join(attribution.split("\n"))
    leaks = []
    for width in range(24, 80, 3):
        lines = textwrap.wrap(one_line, width, break_on_hyphens=False, break_long_words=False)
        if len(lines) > 3:
            continue
        for history in (QUOTE,) if attribution in NAME_ONLY_LINES else (QUOTE, HISTORY):
            wrapped = "\n".join(lines)
            reply = strip_reply(f"{REPLY}\n\n{wrapped}\n\n{history}")
            if reply != REPLY:
                leaks.append((width, reply))
    assert leaks == []


OUTLOOK_BLOCKS = [
    (
        "it-reply-to",
        "Da: Mario Rossi <mario@example.com>\nRisposta: mario@example.com\nData: lunedì 3 marzo 2025 14:20\nA: Alice\nOggetto: Cifre",
    ),
    (
        "fr-orange",
        "Expéditeur: Jean Dupont <jean@example.com>\nDate: 03/03/25 14:20\nDestinataire: Alice\nRépondre à: jean@example.com\nObjet: Chiffres",
    ),
    (
        "nl-reply-to",
        "Van: Jan de Vries <jan@example.com>\nBeantwoorden - Aan: jan@example.com\nDatum: maandag 3 maart 2025 14:20\nAan: Alice",
    ),
    (
        "en",
        "From: Bob Smith <bob@example.com>\nSent: Monday, March 3, 2025 2:20 PM\nTo: Alice <alice@example.com>\nSubject: RE: Figures",
    ),
    (
        "en-bold",
        "*From:* Bob Smith <bob@example.com>\n*Sent:* Monday, March 3, 2025 2:20 PM\n*To:* Alice <alice@example.com>\n*Subject:* RE: Figures",
    ),
    (
        "en-rule",
        "________________________________\nFrom: Bob Smith <bob@example.com>\nSent: Monday, March 3, 2025 2:20 PM\nTo: Alice\nSubject: RE: Figures",
    ),
    (
        "en-original",
        "-----Original Message-----\nFrom: Bob Smith [mailto:bob@example.com]\nSent: Monday, March 3, 2025 2:20 PM\nTo: Alice\nSubject: RE: Figures",
    ),
    (
        "en-bold-original",
        "*-------- Original Message --------*\n*Subject:* Figures\n*From:* Bob Smith <bob@example.com>\n*Date:* 3 March 2025 14:20",
    ),
    (
        "en-samsung",
        "-------- Original message --------\nFrom: Bob Smith <bob@example.com> \nDate: 03/03/2025 14:20 (GMT+01:00) \nTo: Alice <alice@example.com> \nSubject: Figures ",
    ),
    (
        "en-reply-message",
        "-------- Reply Message --------\nFrom: Bob Smith <bob@example.com>\nDate: 3/3/2025 14:20",
    ),
    (
        "en-gmx-original-mail",
        "---- Original Mail ----\nFrom: Bob Smith <bob@example.com>\nDate: 3/3/2025 14:20",
    ),
    (
        "de",
        "-----Ursprüngliche Nachricht-----\nVon: Hans Müller <hans@example.com>\nGesendet: Montag, 3. März 2025 14:20\nAn: Alice\nCc: \nBetreff: AW: Zahlen",
    ),
    (
        "de-gmx",
        '-----Original-Nachricht-----\nBetreff: Zahlen\nDatum: 2025-03-03T14:20:00+0100\nVon: "Hans Müller" <hans@example.com>\nAn: alice@example.com',
    ),
    (
        "de-mac",
        "Von: Hans Müller <hans@example.com>\nGesendet am: Montag, 3. März 2025 14:20\nAn: Alice\nBetreff: Zahlen",
    ),
    (
        "es",
        "-----Mensaje original-----\nDe: Juan Pérez <juan@example.com>\nEnviado el: lunes, 3 de marzo de 2025 14:20\nPara: Alice\nAsunto: RE: Cifras",
    ),
    (
        "es-no-rule",
        "De: Juan Pérez <juan@example.com>\nEnviado el: lunes, 3 de marzo de 2025 14:20\nPara: Alice\nAsunto: RE: Cifras",
    ),
    (
        "fr",
        "-----Message d'origine-----\nDe : Jean Dupont <jean@example.com>\nEnvoyé : lundi 3 mars 2025 14:20\nÀ : Alice\nObjet : RE: Chiffres",
    ),
    (
        "fr-samsung",
        "-------- Message original --------\nDe : Jean Dupont <jean@example.com>\nDate : 03/03/2025 14:20 (GMT+01:00)\nÀ : Alice\nObjet : Chiffres",
    ),
    (
        "fr-mac",
        "De : Jean Dupont <jean@example.com>\nEnvoyé le : lundi 3 mars 2025 à 14:20\nÀ : Alice\nObjet : Chiffres",
    ),
    (
        "it",
        "-----Messaggio originale-----\nDa: Mario Rossi <mario@example.com>\nInviato: lunedì 3 marzo 2025 14:20\nA: Alice\nOggetto: R: Cifre",
    ),
    (
        "it-libero",
        "----Messaggio originale----\nDa: mario@example.com\nData: 3-mar-2025 14.20\nA: <alice@example.com>\nOgg: Risposta: Cifre",
    ),
    (
        "it-inviato-il",
        "Da: Mario Rossi <mario@example.com>\nInviato il: lunedì 3 marzo 2025 14:20\nA: Alice\nOggetto: Cifre",
    ),
    (
        "nl",
        "-----Oorspronkelijk bericht-----\nVan: Jan de Vries <jan@example.com>\nVerzonden: maandag 3 maart 2025 14:20\nAan: Alice\nOnderwerp: RE: Cijfers",
    ),
    (
        "nl-samsung",
        "-------- Origineel bericht --------\nVan: Jan de Vries <jan@example.com>\nDatum: 03-03-2025 14:20\nAan: Alice\nOnderwerp: Cijfers",
    ),
    (
        "nl-mac",
        "Van: Jan de Vries <jan@example.com>\nVerzonden op: maandag 3 maart 2025 14:20\nAan: Alice\nOnderwerp: Cijfers",
    ),
    (
        "pt",
        "-----Mensagem original-----\nDe: João Silva <joao@example.com>\nEnviada em: segunda-feira, 3 de março de 2025 14:20\nPara: Alice\nAssunto: RE: Números",
    ),
    (
        "pt-br",
        "De: João Silva <joao@example.com>\nEnviado em: segunda-feira, 3 de março de 2025 14:20\nPara: Alice\nAssunto: Números",
    ),
    (
        "pt-data-de-envio",
        "De: João Silva <joao@example.com>\nData de envio: segunda-feira, 3 de março de 2025 14:20\nPara: Alice\nAssunto: Números",
    ),
    (
        "sv",
        "-----Ursprungligt meddelande-----\nFrån: Sven Svensson <sven@example.com>\nSkickat: den 3 mars 2025 14:20\nTill: Alice\nÄmne: SV: Siffror",
    ),
    (
        "sv-samsung",
        "-------- Originalmeddelande --------\nFrån: Sven Svensson <sven@example.com>\nDatum: 2025-03-03 14:20\nTill: Alice",
    ),
    (
        "da",
        "-----Oprindelig meddelelse-----\nFra: Søren Hansen <soren@example.com>\nSendt: 3. marts 2025 14:20\nTil: Alice\nEmne: SV: Tal",
    ),
    (
        "no",
        "-----Opprinnelig melding-----\nFra: Ola Nordmann <ola@example.com>\nSendt: 3. mars 2025 14:20\nTil: Alice\nEmne: SV: Tall",
    ),
    (
        "fi",
        "-----Alkuperäinen viesti-----\nLähettäjä: Matti Virtanen <matti@example.com>\nLähetetty: 3. maaliskuuta 2025 14:20\nVastaanottaja: Alice\nAihe: VS: Luvut",
    ),
    (
        "pl",
        "-----Oryginalna wiadomość-----\nOd: Jan Kowalski <jan@example.com>\nWysłano: poniedziałek, 3 marca 2025 14:20\nDo: Alice\nTemat: RE: Liczby",
    ),
    (
        "pl-samsung",
        "-------- Wiadomość oryginalna --------\nOd: Jan Kowalski <jan@example.com>\nData: 03.03.2025 14:20\nDo: Alice",
    ),
    (
        "cs",
        "-----Původní zpráva-----\nOd: Jan Novák <jan@example.com>\nOdesláno: pondělí 3. března 2025 14:20\nKomu: Alice\nPředmět: RE: Čísla",
    ),
    (
        "sk",
        "-----Pôvodná správa-----\nOd: Ján Novák <jan@example.com>\nOdoslané: pondelok 3. marca 2025 14:20\nKomu: Alice\nPredmet: RE: Čísla",
    ),
    (
        "ru",
        "-----Исходное сообщение-----\nОт: Иван Петров <ivan@example.com>\nОтправлено: 3 марта 2025 г. 14:20\nКому: Alice\nТема: RE: Цифры",
    ),
    (
        "ru-samsung",
        "-------- Оригинальное сообщение --------\nОт: Иван Петров <ivan@example.com>\nДата: 03.03.2025 14:20\nКому: Alice",
    ),
    (
        "uk",
        "-----Вихідне повідомлення-----\nВід: Іван Петренко <ivan@example.com>\nНадіслано: 3 березня 2025 р. 14:20\nКому: Alice\nТема: RE: Цифри",
    ),
    (
        "hu",
        "-----Eredeti üzenet-----\nFeladó: Kovács János <janos@example.com>\nElküldve: 2025. március 3. 14:20\nCímzett: Alice\nTárgy: RE: Számok",
    ),
    (
        "ro",
        "-----Mesaj original-----\nDe la: Ion Popescu <ion@example.com>\nTrimis: luni, 3 martie 2025 14:20\nCătre: Alice\nSubiect: RE: Cifre",
    ),
    (
        "tr",
        "-----Özgün İleti-----\nKimden: Ali Yılmaz <ali@example.com>\nGönderildi: 3 Mart 2025 Pazartesi 14:20\nKime: Alice\nKonu: YNT: Rakamlar",
    ),
    (
        "tr-samsung",
        "-------- Orijinal mesaj --------\nKimden: Ali Yılmaz <ali@example.com>\nTarih: 03.03.2025 14:20\nKime: Alice",
    ),
    (
        "el",
        "-----Αρχικό μήνυμα-----\nΑπό: Γιώργος Παπαδόπουλος <giorgos@example.com>\nΣτάλθηκε: Δευτέρα, 3 Μαρτίου 2025 2:20 μμ\nΠρος: Alice\nΘέμα: RE: Αριθμοί",
    ),
    (
        "he",
        "-----הודעה מקורית-----\nמאת: דוד כהן <david@example.com>\nנשלח: יום שני 3 מרץ 2025 14:20\nאל: Alice\nנושא: RE: מספרים",
    ),
    (
        "hr",
        "-----Izvorna poruka-----\nŠalje: Ivan Horvat <ivan@example.com>\nPoslano: ponedjeljak, 3. ožujka 2025. 14:20\nPrima: Alice\nPredmet: RE: Brojke",
    ),
    (
        "sr",
        "-----Originalna poruka-----\nPošiljalac: Petar Petrović <petar@example.com>\nPoslato: 3. mart 2025. 14:20\nPrima: Alice",
    ),
    (
        "lt",
        "-----Original Message-----\nSiuntėjas: Jonas Jonaitis <jonas@example.com>\nIšsiųsta: 2025 m. kovo 3 d. 14:20\nKam: Alice\nTema: RE: Skaičiai",
    ),
    (
        "ja",
        "-----元のメッセージ-----\n差出人: 山田太郎 <taro@example.com>\n送信日時: 2025年3月3日 14:20\n宛先: Alice\n件名: RE: 数字",
    ),
    ("ja-date-cc", "差出人: 山田太郎 <taro@example.com>\n日付: 2025年3月3日 14:20\nCC: Alice"),
    (
        "zh",
        "-----原始邮件-----\n发件人: 张伟 <zhangwei@example.com>\n发送时间: 2025年3月3日 14:20\n收件人: Alice\n主题: 回复: 数字",
    ),
    (
        "zh-tw",
        "-----原始郵件-----\n寄件者: 陳大文 <chen@example.com>\n日期: 2025年3月3日 14:20\n收件者: Alice\n主旨: 回覆: 數字\n副本: Bob",
    ),
    (
        "zh-foxmail",
        "发件人: 张伟 <zhangwei@example.com>\n發送時間: 2025年3月3日 14:20\n抄送: Alice",
    ),
    (
        "ko",
        "-----원본 메시지-----\n보낸 사람: 김철수 <kim@example.com>\n보낸 날짜: 2025년 3월 3일 월요일 오후 2:20\n받는 사람: Alice\n제목: RE: 숫자\n참조: Bob",
    ),
    (
        "el-dates",
        "Από: Γιώργος <giorgos@example.com>\nΗμερομηνία: 3 Μαρτίου 2025 14:20\nΚοιν.: Alice",
    ),
    (
        "unknown-language",
        "Mula kay: Juan Dela Cruz <juan@example.com>\nIpinadala: Lunes, Marso 3, 2025 2:20 PM\nPara kay: Alice\nPaksa: Mga numero",
    ),
]


@pytest.mark.parametrize(
    "block", [b for _, b in OUTLOOK_BLOCKS], ids=[i for i, _ in OUTLOOK_BLOCKS]
)
def test_an_embedded_outlook_message_is_history_below_the_note(block: str) -> None:
    body = f"{REPLY}\n\n{block}\n\n{HISTORY}"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


@pytest.mark.parametrize(
    "block", [b for _, b in OUTLOOK_BLOCKS], ids=[i for i, _ in OUTLOOK_BLOCKS]
)
def test_an_embedded_outlook_message_over_quoted_lines(block: str) -> None:
    quoted = "\n".join(f"> {line}" for line in HISTORY.splitlines())
    body = f"{REPLY}\n\n{block}\n{quoted}\n"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


@pytest.mark.parametrize(
    "subject", ["FW: Figures", "[EXT] FW: Figures", "FWD: Figures", "TR : Chiffres", "Wg: Zahlen"]
)
def test_an_outlook_block_is_a_forward_when_the_subject_says_so(subject: str) -> None:
    body = f"Please look at this.\n\n{dict(OUTLOOK_BLOCKS)['en']}\n\n{HISTORY}"
    message = parse_email(mail(body, subject=subject))
    assert message.content == "Please look at this."
    assert message.forwarded is not None
    assert message.forwarded.sender == "bob@example.com"
    assert message.forwarded.body == HISTORY.strip()


CLIENT_LINES = [
    ("en-iphone", "Sent from my iPhone"),
    ("en-ipad-link", "Sent from my iPad<https://www.apple.com/ipad>"),
    ("en-outlook-mobile", "Sent from Outlook Mobile"),
    ("en-get-outlook", "Get Outlook for iOS<https://aka.ms/o0ukef>"),
    ("en-get-outlook-android", "Get Outlook for Android"),
    ("en-yahoo", "Sent from Yahoo Mail on Android"),
    ("en-yahoo-iphone", "Sent from Yahoo Mail for iPhone"),
    ("en-windows", "Sent from Mail for Windows"),
    ("en-galaxy", "Sent from my Galaxy"),
    ("en-samsung-carrier", "Sent from my Verizon, Samsung Galaxy smartphone"),
    ("en-blackberry", "Sent via BlackBerry from T-Mobile"),
    ("en-proton", "Sent with Proton Mail secure email."),
    ("en-spark", "Sent using Spark"),
    ("fr-iphone", "Envoyé de mon iPhone"),
    ("fr-iphone-depuis", "Envoyé depuis mon iPhone"),
    ("fr-outlook", "Obtenir Outlook pour iOS<https://aka.ms/o0ukef>"),
    ("fr-android", "Envoyé à partir de mon smartphone Samsung Galaxy."),
    ("de-iphone", "Von meinem iPhone gesendet"),
    ("de-android", "Gesendet von meinem Android-Gerät"),
    ("de-outlook", "Outlook für iOS beziehen<https://aka.ms/o0ukef>"),
    ("de-gmx", "Diese Nachricht wurde von meinem Android Mobiltelefon mit GMX Mail gesendet."),
    ("de-samsung", "Von meinem Samsung Galaxy Smartphone gesendet."),
    ("de-samsung-galaxy", "Von meinem/meiner Galaxy gesendet"),
    ("en-phone", "(sent from a phone)"),
    ("en-cell", "Sent from my cell, please excuse any typos."),
    ("es-iphone", "Enviado desde mi iPhone"),
    ("es-outlook", "Obtener Outlook para iOS<https://aka.ms/o0ukef>"),
    ("pt-iphone", "Enviado do meu iPhone"),
    ("pt-outlook", "Baixe o Outlook para Android"),
    ("it-iphone", "Inviato da iPhone"),
    ("it-outlook", "Scarica Outlook per iOS<https://aka.ms/o0ukef>"),
    ("it-outlook-ottieni", "Ottieni Outlook per Android"),
    ("pl-outlook", "Pobierz aplikację Outlook dla systemu Android"),
    ("sv-outlook", "Skaffa Outlook för iOS<https://aka.ms/o0ukef>"),
    ("fr-outlook-telecharger", "Télécharger Outlook pour Android"),
    ("en-outlook-mac", "Download Outlook for Mac"),
    ("nl-iphone", "Verstuurd vanaf mijn iPhone"),
    ("nl-iphone-verzonden", "Verzonden vanaf mijn iPhone"),
    ("nl-outlook", "Outlook voor iOS downloaden<https://aka.ms/o0ukef>"),
    ("sv-iphone", "Skickat från min iPhone"),
    ("da-iphone", "Sendt fra min iPhone"),
    ("no-outlook", "Hent Outlook til iOS<https://aka.ms/o0ukef>"),
    ("fi-iphone", "Lähetetty iPhonesta"),
    ("pl-iphone", "Wysłane z iPhone'a"),
    ("cs-iphone", "Odesláno z iPhonu"),
    ("sk-iphone", "Odoslané z iPhonu"),
    ("ru-iphone", "Отправлено с iPhone"),
    ("uk-iphone", "Надіслано з iPhone"),
    ("tr-iphone", "iPhone'umdan gönderildi"),
    ("hu-iphone", "Küldve iPhone-ról"),
    ("ro-iphone", "Trimis de pe iPhone-ul meu"),
    ("el-iphone", "Στάλθηκε από το iPhone μου"),
    ("ja-iphone", "iPhoneから送信"),
    ("zh-iphone", "发自我的iPhone"),
    ("zh-tw-iphone", "從我的 iPhone 傳送"),
    ("en-from-my", "From my iPhone 6"),
    ("en-name-from-mobile", "Nik from mobile"),
    ("en-parenthesised", "(Sent from mobile device)"),
    ("en-sent-by", "<<sent by galaxy>>"),
    ("ko-iphone", "나의 iPhone에서 보냄"),
]


@pytest.mark.parametrize("line", [c for _, c in CLIENT_LINES], ids=[i for i, _ in CLIENT_LINES])
def test_a_client_signature_line_goes(line: str) -> None:
    body = (
        f"{REPLY}\n\n{line}\n\nOn Mon, Mar 3, 2025 at 2:20 PM Bob <bob@example.com> wrote:\n{QUOTE}"
    )
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY
    assert strip_reply(f"{REPLY}\n\n{line}\n") == REPLY


@pytest.mark.parametrize(
    "line",
    [
        "Sent from my desk, is much easier than my mobile phone.",
        "Sent from the office",
        "I sent from my iPhone the pictures you asked for, and more will follow tomorrow.",
    ],
)
def test_a_sentence_that_mentions_sending_is_kept(line: str) -> None:
    assert not is_client_line(line)
    assert strip_reply(f"{REPLY}\n\n{line}") == f"{REPLY}\n\n{line}"


def test_invisible_tracking_characters_go() -> None:
    body = f"{REPLY}\u200b\n\u200c\u200b\u2060\ufeff\n\u034f \u200c \u034f \u200c\n\n{QUOTE}"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


def test_an_emoji_keeps_its_joiner() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert strip_reply(f"Thanks {family}\u200d") == f"Thanks {family}"


def test_quoted_history_without_an_attribution_goes() -> None:
    body = f"{REPLY}\n\n{QUOTE}\n> > Earlier: what happened in Q4?\n"
    assert parse_email(mail(body, subject="Re: Figures")).content == REPLY


def test_answers_written_inside_the_quote_are_kept() -> None:
    body = (
        "Le lun. 3 mars 2025 à 14:20, Jean Dupont-Lefebvre de la Fontaine <\n"
        "jean.dupont@example.com> a écrit :\n\n"
        "> Question one: the figures?\n\n"
        "12,400 in January.\n\n"
        "> Question two: the deadline?\n> Bob\n\n"
        "Friday.\n\n"
        "Sent from my iPhone\n"
    )
    assert parse_email(mail(body, subject="Re: Figures")).content == "12,400 in January.\n\nFriday."


@pytest.mark.parametrize(
    ("above", "attribution"),
    [
        ("See you at 14:00", "On Mon, Mar 3, 2025 at 2:20 PM Bob <bob@example.com> wrote:"),
        ("Thanks,", "On Mon, Mar 3, 2025 at 2:20 PM Bob <bob@example.com> wrote:"),
        ("Dzięki", "pon., 3 mar 2025 o 14:20 Jan Kowalski <jan@example.com> napisał(a):"),
        ("Merci", "Le 3 mars 2025 à 14:20, Jean <jean@example.com> a écrit :"),
    ],
    ids=["time", "comma", "lowercase-attribution", "no-blank-line"],
)
def test_the_line_right_above_an_attribution_is_kept(above: str, attribution: str) -> None:
    assert strip_reply(f"{REPLY}\n{above}\n{attribution}\n{QUOTE}") == f"{REPLY}\n{above}"


def test_a_bold_header_block_whose_address_wraps_goes() -> None:
    body = (
        "Hi\n\n  *From:* bob@example.com [mailto:\n  bob@example.com]\n"
        "  *Sent:* Wednesday, June 27, 2012 3:05 PM\n  *To:* travis@example.com\n"
        "  *Subject:* Hello\n\nThe history.\n"
    )
    assert strip_reply(body) == "Hi"


def test_blank_lines_around_a_dropped_quote_collapse() -> None:
    body = f"{REPLY}\n\nOn 04/19/2011 07:10 AM, Bob wrote:\n\n{QUOTE}\nRegards, Alice"
    assert strip_reply(body) == f"{REPLY}\n\nRegards, Alice"


def test_a_list_of_labels_written_by_the_person_is_kept() -> None:
    body = "My details:\n\nName: Alice Example\nCompany: Acme\nCity: Lisbon\n\nCan you register me?"
    assert strip_reply(body) == body


@pytest.mark.parametrize(
    "line",
    ["I wrote to <bob@example.com>", "==============================", "Here is what I wrote:"],
)
def test_a_line_of_the_person_that_looks_like_a_header_keeps_what_follows(line: str) -> None:
    body = f"{REPLY}\n\n{line}\n\nThe rest of what I wrote."
    assert strip_reply(body) == body


def test_a_colon_line_over_unquoted_text_that_names_no_sender_is_kept() -> None:
    body = "Meeting on 3/3/2025 at 14:20:\n\nPlease bring the figures."
    assert strip_reply(body) == body


def test_an_html_outlook_reply_in_german_loses_the_header_block() -> None:
    html = (
        "<html><body><p>Passt, danke!</p>"
        "<div style='border:none;border-top:solid #E1E1E1 1.0pt'>"
        "<p class=MsoNormal><b>Von:</b> Hans Müller &lt;hans@example.com&gt;<br>"
        "<b>Gesendet:</b> Montag, 3. März 2025 14:20<br><b>An:</b> Alice<br>"
        "<b>Betreff:</b> Zahlen</p></div><p>Die Zahlen bitte.</p></body></html>"
    )
    message = EmailMessage()
    message["From"] = "Alice <alice@example.com>"
    message["To"] = "assistant@acme.example"
    message["Subject"] = "AW: Zahlen"
    message.set_content(html, subtype="html")
    assert parse_email(message.as_bytes()).content == "Passt, danke!"


@pytest.mark.parametrize(
    "quote",
    [
        '<div class="protonmail_quote">On Monday, March 3rd, 2025 at 14:20, Bob wrote:'
        "<blockquote>The figures?</blockquote></div>",
        '<div class="zmail_extra"><div>---- On Mon, 03 Mar 2025 14:20 Bob wrote ----</div>'
        "<blockquote>The figures?</blockquote></div>",
        '<hr id="zwchr"><div data-marker="__QUOTED_TEXT__"><b>From: </b>Bob<br>'
        "<b>Sent: </b>Monday, 3 March 2025 14:20<br>The figures?</div>",
        '<div id="mail-editor-reference-message-container"><div>Από: Bob &lt;bob@x.gr&gt;'
        "</div><div>Ημερομηνία: 3/3/2025</div><p>The figures?</p></div>",
        "<hr><div>Από: Bob &lt;bob@x.gr&gt;</div><div>The figures?</div>",
    ],
    ids=["proton-mail", "zoho-mail", "zimbra", "new-outlook", "yahoo-rule-greek"],
)
def test_html_quotes_of_more_clients_go(quote: str) -> None:
    message = EmailMessage()
    message["From"] = "Alice <alice@example.com>"
    message["To"] = "assistant@acme.example"
    message["Subject"] = "Re: Figures"
    message.set_content(f"<html><body><div>{REPLY}</div>{quote}</body></html>", subtype="html")
    assert parse_email(message.as_bytes()).content == REPLY


# --- every table entry has a mail above -----------------------------------------------------

SAMPLES = (
    [a for _, a in ATTRIBUTIONS] + [b for _, b in OUTLOOK_BLOCKS] + [c for _, c in CLIENT_LINES]
)


def _joined(text: str) -> list[str]:
    """The sample's lines, and its lines joined as the extractor joins wrapped attributions."""
    lines = text.split("\n")
    return [*lines, " ".join(line.strip() for line in lines)]


@pytest.mark.parametrize(
    ("table", "pattern"),
    [
        (name, pattern)
        for name in (
            "ATTRIBUTION_VERBS",
            "ATTRIBUTION_FORMS",
            "ORIGINAL_MESSAGE",
            "HEADER_FROM",
            "HEADER_OTHER",
            "MOBILE_SIGNATURES",
        )
        for pattern in getattr(rp, name)
    ],
    ids=lambda value: value if isinstance(value, str) else value.pattern[:40],
)
def test_every_table_entry_has_a_sample_mail(table: str, pattern: re.Pattern[str]) -> None:
    if table in ("HEADER_FROM", "HEADER_OTHER"):
        anchored = re.compile(rf"^\W*(?:{pattern.pattern})\s?[:：]", re.I)
        assert any(anchored.search(line) for s in SAMPLES for line in s.split("\n"))
    elif table == "MOBILE_SIGNATURES":
        assert any(pattern.search(line) for _, line in CLIENT_LINES)
    else:
        assert any(pattern.search(line) for s in SAMPLES for line in _joined(s))
