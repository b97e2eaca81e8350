"""The bench leaderboard: `bench leaderboard [--db URL] [--port N]` or
`streamlit run leaderboard/app.py -- --db URL`. Read-only over the store."""

from pathlib import Path

import streamlit as st

st.set_page_config(page_title="bench leaderboard", page_icon="📈", layout="wide")
HERE = Path(__file__).parent / "pages"
pages = [
    st.Page(HERE / "leaderboard.py", title="Leaderboard", icon="🏁", default=True),
    st.Page(HERE / "grid.py", title="Precision grid", icon="🧮"),
    st.Page(HERE / "run.py", title="Run", icon="📉"),
    st.Page(HERE / "compare.py", title="Compare", icon="⚖️"),
    st.Page(HERE / "builds.py", title="Builds", icon="🧱"),
    st.Page(HERE / "mismatch.py", title="Mismatch", icon="🔬"),
]
st.navigation(pages).run()
