"""Files people send, as the assistant reads them: what a file is (`kinds`), its text within
limits (`extract`, with `pdf`, `office` and `images` per format), run where a hostile file can
do no harm (`reader`), and the content blocks that show it to the model (`blocks`).

Nothing is imported here: the parsers (pypdf, openpyxl, python-docx, python-pptx, Pillow) load
in the reader's child process only, and importing this package must not bring them into the
gateway's.
"""
