"""The web console as a person uses it: headless Chromium against a real 3-daemon testnet.

The page loads without a console error and asks for the key; the map shows the three nodes
within a few seconds; a chat message in the playground streams its answer, says where it was
served, and the request appears in the list with its route (drawn on the map), and opens its
explanation; a node stopped as `meshd testnet down` stops it turns silent on the map. Every wait
is a condition with a deadline (WebDriverWait polls the page), never a sleep.

With ``MESHD_SCREENSHOTS=DIR`` the map and the playground are saved there as PNG (docs/img's
pictures are made so: docs/console.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.testing import browser
from meshd.testnet import launcher
from meshd.testnet.launcher import NodeSpec, down, stop_node, up

WHY_NOT = browser.missing()
pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no browser here: {WHY_NOT}")]
if WHY_NOT is None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

# decoding capped so that an answer takes a second or two: its pieces arrive one by one
MODEL = {**launcher.testnet_models()[0], "max_decode_tokens_per_s": 30.0}
SHOTS = os.environ.get("MESHD_SCREENSHOTS")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("console-mesh")
    # node1, whose console is opened, serves no model: every request it takes is forwarded, so
    # each route is a line on the map
    specs = [NodeSpec(name="node1", models=[])] + [NodeSpec(name=f"node{i}", models=[MODEL]) for i in (2, 3)]
    index = up(root / "net", specs, advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        index["root"] = root / "net"
        yield index
    finally:
        down(root / "net")


@pytest.fixture(scope="module")
def page(mesh: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = browser.open_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, seconds: float, what: str, cond: Any) -> Any:
    """``cond(driver)`` once true, polled every 0.1 s; TimeoutException naming ``what``."""
    return WebDriverWait(driver, seconds, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(cond, f"waiting for {what}")


def nodes_on_map(driver: Any) -> dict[str, str]:
    return {g.get_attribute("data-name"): g.get_attribute("data-state")
            for g in driver.find_elements(By.CSS_SELECTOR, "#map-nodes .node")}


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / name))


def test_the_page_loads_asks_for_the_key_and_maps_three_nodes(mesh: dict[str, Any], page: Any) -> None:
    url = mesh["nodes"][0]["api_url"].removesuffix("/v1") + "/ui/"
    page.get(url)
    wait(page, 10, "the key form", lambda d: d.find_element(By.ID, "key-input").is_displayed())
    page.find_element(By.ID, "key-input").send_keys(mesh["key"] + "\n")
    wait(page, 10, "the node's name", lambda d: d.find_element(By.ID, "node-name").text == "node1")
    wait(page, 5, "three nodes on the map", lambda d: len(nodes_on_map(d)) == 3)
    assert nodes_on_map(page) == {"node1": "self", "node2": "live", "node3": "live"}
    assert page.find_element(By.ID, "link-state").text == "live"
    wait(page, 30, "RTTs measured to both peers", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#map-links line.measured")) == 2)
    rows = page.find_elements(By.CSS_SELECTOR, "#node-table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["node1", "node2", "node3"]
    page.find_element(By.CSS_SELECTOR, '#map-nodes .node[data-name="node2"]').click()
    card = page.find_element(By.ID, "node-card").text
    assert "node2" in card and "tiny-en [0-6 of 6] large fp16" in card and "slots" in card
    assert browser.console_errors(page) == []
    shot(page, "console-map.png")


def test_a_chat_streams_and_the_request_is_listed_with_its_route(mesh: dict[str, Any], page: Any) -> None:
    page.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="playground"]').click()
    wait(page, 10, "the model list", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chat-model option")) >= 2)
    assert page.find_element(By.ID, "chat-model").get_attribute("value") == "auto"
    # count the answer's updates as they land, to see it stream rather than arrive whole
    page.execute_script(
        "window.pieces = 0; new MutationObserver(() => { window.pieces += 1; })"
        ".observe(document.getElementById('chat-log'), {subtree: true, characterData: true, childList: true});")
    page.find_element(By.ID, "chat-input").send_keys("And God said")
    page.find_element(By.ID, "chat-send").click()
    wait(page, 60, "the answer", lambda d: d.find_elements(By.CSS_SELECTOR, ".answer.done"))
    answer = page.find_element(By.CSS_SELECTOR, ".answer.done").text
    assert answer.strip()
    assert page.execute_script("return window.pieces") >= 5
    where = page.find_element(By.CSS_SELECTOR, ".msg.assistant .where").text
    assert where.startswith(("served by node2", "served by node3"))
    rid = page.find_element(By.CSS_SELECTOR, ".request-link").get_attribute("data-id")
    # the route drawn on the map: node1 -> the serving node, which is ringed
    assert len(page.find_elements(By.CSS_SELECTOR, "#map-route line.route")) == 1
    assert page.find_elements(By.CSS_SELECTOR, "#map-route .route-served")
    shot(page, "console-playground.png")

    page.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="requests"]').click()
    row = f'#request-table tbody tr[data-id="{rid}"]'
    wait(page, 10, f"request {rid} in the list", lambda d: d.find_elements(By.CSS_SELECTOR, row))
    cells = [td.text for td in page.find_elements(By.CSS_SELECTOR, f"{row} td")]
    served = where.split()[2]
    assert cells[1] == "tiny-en" and served in cells[2] and cells[-1] == "ok"
    assert cells[7].startswith("large")  # model auto: its tier
    page.find_element(By.CSS_SELECTOR, row).click()
    wait(page, 10, "its explanation", lambda d: d.find_elements(By.ID, "explain-card"))
    text = page.find_element(By.ID, "explain-card").text
    assert f"Request {rid}" in text and "predicted TTFT" in text and f"served by {served}" in text
    assert browser.console_errors(page) == []


def test_the_node_page_shows_identity_config_audit_and_metrics(page: Any) -> None:
    page.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="node"]').click()
    wait(page, 10, "the node page", lambda d: d.find_elements(By.CSS_SELECTOR, "#node-facts .metrics"))
    text = page.find_element(By.ID, "node-facts").text
    for said in ("certificate", "expires in", "[api]", "config_loaded", "key_loaded",
                 "Requests this node took in as entry node"):
        assert said in text, said
    assert browser.console_errors(page) == []


def test_a_stopped_node_turns_silent_on_the_map(mesh: dict[str, Any], page: Any) -> None:
    page.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="mesh"]').click()
    assert stop_node(mesh["root"], "node3")
    wait(page, 20, "node3 silent on the map", lambda d: nodes_on_map(d).get("node3") == "silent")
    assert nodes_on_map(page) == {"node1": "self", "node2": "live", "node3": "silent"}
    assert "silent" in page.find_element(By.CSS_SELECTOR, '#map-nodes .node[data-name="node3"]').text
    assert browser.console_errors(page) == []
