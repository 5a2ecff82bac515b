"""/docs works without internet: Swagger UI from the package's files, every operation listed."""

from tests.dashboards.test_browser import browser, empty_server  # noqa: F401  (fixtures)


def test_docs_page_lists_the_operations_offline(browser, empty_server):  # noqa: F811
    page = browser.new_page()
    outside = []

    def offline(route):
        # Any request off the service's host fails as it would on a machine without internet.
        if route.request.url.startswith(empty_server.url):
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    page.route("**/*", offline)
    page.goto(empty_server.url + "/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.textContent)")
    assert "/v1/configs/best" in [p.replace("\u200b", "") for p in paths]
    assert not outside, f"/docs asked for {outside}"
    page.close()
