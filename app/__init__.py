"""The Streamlit app: thin pages over `engine`. Start it with `./run app` (streamlit run app/main.py)."""
