"""The simulated vLLM node: a stand-in server (`server`, stdlib-only) and the images that carry it (`image`).

Kept apart from the deploy core: nothing outside tests, the demo and `b70deploy sim` imports it.
"""
