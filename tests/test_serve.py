"""What `python app.py` tells its user once the page is served."""
from specviz.ui.serve import serving_message


def test_without_share_the_hint_is_the_apps_own_flag():
    line = serving_message("http://127.0.0.1:7860/", None, share=False)
    assert "http://127.0.0.1:7860/" in line and "--share" in line and "share=True" not in line


def test_with_share_both_addresses_or_why_not():
    assert "https://x.gradio.live" in serving_message("http://127.0.0.1:7860/", "https://x.gradio.live", share=True)
    assert "could not be made" in serving_message("http://127.0.0.1:7860/", None, share=True)
