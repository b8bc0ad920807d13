"""What RabbitMQ's own management UI asks before and beside the objects it shows.

`/api/auth` is asked before anyone signs in, to learn whether the UI should send its users to
an OAuth 2 provider: answered without credentials, as RabbitMQ answers it (HareMQ has no
OAuth, so the UI shows its own sign-in form; both 3.10's names and 3.11's are given).
`/api/extensions` lists the scripts the UI loads after signing in, as RabbitMQ's management
plugin registers them: only the UI's own router (`dispatcher.js`, which RabbitMQ lists as its
first extension; without it the UI shows no page), since HareMQ has no plugins."""
from __future__ import annotations

from aiohttp import web

from .responses import as_json
from .routes import Routes

PUBLIC = frozenset({"/api/auth"})      # the paths answered without credentials


class UIRoutes(Routes):
    async def auth_settings(self, request) -> web.Response:
        return as_json({"enable_uaa": False, "uaa_client_id": "", "uaa_location": "",
                        "oauth_enabled": False, "oauth_client_id": "", "oauth_provider_url": ""})

    async def extensions(self, request) -> web.Response:
        return as_json([{"javascript": "dispatcher.js"}])
