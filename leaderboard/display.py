"""How the app's tables show what is missing: "–", never "None" or "nan".

Numeric columns keep their NaN (so number formats, progress bars and sorting still work) and
the table draws them with st.dataframe's `placeholder`; text and list cells are written out
on a display copy (a list such as a cell's seeds as "0 1 –"). The store's frames are never
changed: display copies only. `bench report` keeps "-" in the terminal and empty CSV fields."""

from __future__ import annotations

import inspect
import math

import pandas as pd
import streamlit as st

MISSING = "–"


def is_missing(x) -> bool:
    """None, NaN, NaT and pandas' NA (not an empty list or string)."""
    if x is None or x is pd.NA or x is pd.NaT:
        return True
    if isinstance(x, float):
        return math.isnan(x)
    try:
        return bool(pd.isna(x)) if not isinstance(x, (list, tuple, dict, set, str)) else False
    except (TypeError, ValueError):
        return False


def cell_text(x) -> str:
    """One cell as text: MISSING for a missing value, list items joined by spaces (each
    missing item MISSING), anything else str()."""
    if isinstance(x, (list, tuple)):
        return " ".join(cell_text(v) for v in x) if x else MISSING
    return MISSING if is_missing(x) else str(x)


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A display copy: every object column (text, lists, mixed) as text with MISSING for
    missing values; numeric, boolean and datetime columns unchanged."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or isinstance(out[col].dtype, pd.StringDtype):
            out[col] = out[col].map(cell_text)
    return out


def _has_placeholder() -> bool:
    try:
        return "placeholder" in inspect.signature(st.dataframe).parameters
    except (TypeError, ValueError):
        return False


HAS_PLACEHOLDER = _has_placeholder()


def table_kwargs(**kw) -> dict:
    """st.dataframe keyword arguments with the missing-value placeholder (Streamlit versions
    that have it; older ones show numeric NaN as their default)."""
    if HAS_PLACEHOLDER:
        kw.setdefault("placeholder", MISSING)
    return kw


def dataframe(df: pd.DataFrame, style=None, **kw):
    """st.dataframe of a display copy of `df`, missing values shown as MISSING; `style` (e.g.
    leaderboard/colours.py `styled`) turns the display copy into a pandas Styler first."""
    shown = display_frame(df)
    if style is not None:
        shown = style(shown).format(na_rep=MISSING)
    return st.dataframe(shown, **table_kwargs(**kw))
