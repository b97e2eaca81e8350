"""The Streamlit leaderboard over the store."""
