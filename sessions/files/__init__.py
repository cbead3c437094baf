"""Files people send, as the assistant reads them: what a file is (`kinds`), its text within
limits (`extract`, with `pdf` and `office` per format), run where a hostile file can do no
harm (`reader`), and the content blocks that show it to the model (`blocks`, `images`)."""

from sessions.files.blocks import FileForModel, fenced_text, file_blocks
from sessions.files.extract import read_file
from sessions.files.kinds import FileKind, FileType, sniff
from sessions.files.limits import FileText, ReadLimits
from sessions.files.reader import FileReader

__all__ = [
    "FileForModel",
    "FileKind",
    "FileReader",
    "FileText",
    "FileType",
    "ReadLimits",
    "fenced_text",
    "file_blocks",
    "read_file",
    "sniff",
]
