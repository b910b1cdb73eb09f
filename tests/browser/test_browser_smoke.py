"""The browser fixture itself: a real Chromium runs a page's script."""


def test_chromium_runs_a_pages_script_on_click(page):
    page.set_content('<button onclick="this.textContent = \'clicked \' + (1 + 1)">press</button>')
    page.get_by_role("button", name="press").click()
    assert page.get_by_role("button").text_content() == "clicked 2"
