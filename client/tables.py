"""Tables that fit the terminal they are printed on (``raylane ls``, ``events``, ...).

Rich's own table squeezes every column alike when a row is too wide, which cuts
ids and statuses and wraps names. Here each column says whether it may be cut
and in which order: the columns a user copies or reads (an id, a name, a status)
are never cut; the others are cut in order (REASON first), each down to its
minimum and then dropped, before the next is touched. A row whose fixed columns
alone are wider than the terminal is printed whole: a cut id is worse than a
wrapped line.

Ids are shown by the shortest start that tells the rows shown apart (never less
than ``ID_MIN_CHARS``): the server accepts any unique start of an id.

Client dependencies only (rich).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

# A start shorter than this is the millisecond the id was made (10 characters)
# and little more; jobs not on screen would share it.
ID_MIN_CHARS = 12
GAP = 2  # spaces between columns


@dataclass
class Col:
    header: str
    cut: Optional[int] = None  # None: never cut; else the order it is cut in (0 first)
    min_width: int = 4  # the narrowest it is cut to before it is dropped
    justify: str = "left"


def unique_prefixes(ids: Sequence[str], floor: int = ID_MIN_CHARS) -> list[str]:
    """Each id's shortest start (at least ``floor`` characters) that no other id shown shares."""
    out = []
    for i, x in enumerate(ids):
        n = min(len(x), floor)
        for j, y in enumerate(ids):
            if i != j and y != x:
                common = 0
                for a, b in zip(x, y):
                    if a != b:
                        break
                    common += 1
                n = max(n, min(len(x), common + 1))
        out.append(x[:n])
    return out


def _plain_len(cell: str) -> int:
    from rich.text import Text

    return Text.from_markup(cell).cell_len


def widths(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> list[Optional[int]]:
    """The width of each column (None: dropped) so that a row fits in ``width``."""
    natural = [max([len(c.header)] + [_plain_len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    w: list[Optional[int]] = list(natural)

    def total() -> int:
        shown = [x for x in w if x is not None]
        return sum(shown) + GAP * (len(shown) - 1)

    order = sorted((c.cut, i) for i, c in enumerate(cols) if c.cut is not None)
    for _, i in order:  # in order: cut down to its minimum, and if that is not enough, dropped
        excess = total() - width
        if excess <= 0:
            return w
        w[i] = max(min(natural[i], cols[i].min_width), natural[i] - excess)
        if total() > width:
            w[i] = None
    return w


def render(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int):
    """A rich Table of ``rows`` (cells in rich markup) whose lines fit ``width`` where they can."""
    from rich.table import Table

    w = widths(cols, rows, width)
    t = Table(box=None, pad_edge=False, header_style="bold", padding=(0, GAP // 2), expand=False)
    keep = [i for i, x in enumerate(w) if x is not None]
    for i in keep:
        c = cols[i]
        t.add_column(c.header, width=w[i], min_width=w[i], max_width=w[i], no_wrap=True, overflow="ellipsis",
                     justify=c.justify)
    for r in rows:
        t.add_row(*[r[i] for i in keep])
    need = sum(w[i] for i in keep) + GAP * (len(keep) - 1)
    return t, need


def print_table(console, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> None:
    """Print the fitted table; wider than the terminal only when the uncut columns are."""
    table, need = render(cols, rows, console.width)
    if need > console.width:
        console.width = need  # never cut an id, a name or a status: the terminal wraps the line instead
    console.print(table)
