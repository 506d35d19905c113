"""The report page's file: whatever a sample holds (markup, a closing script tag, the page's own markers) stays
data, read back exactly from the page; nothing is fetched from anywhere."""

from __future__ import annotations

import json
import re

from evaluators.view import render_page

HOSTILE = '</script><script>alert(1)</script><!-- __DATA__ __JS__ "quoted" & <b>bold</b>'


def _embedded(page: str) -> dict:
    found = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, flags=re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_sample_text_stays_data_and_reads_back_exactly():
    data = {"kind": "run", "title": HOSTILE, "samples": {"t": [{"output": HOSTILE, "prompt": "p"}]}}
    page = render_page(data)
    assert _embedded(page) == data
    assert page.count("</script>") == 2  # the data's own and the script's, none from the sample
    assert "<title>&lt;/script&gt;" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
