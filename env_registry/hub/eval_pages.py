"""The hub's pages of an uploaded eval's episodes: ``/evals/<id>/`` (the summary, the episodes with their filters,
a page at a time) and ``/evals/<id>/episodes/<i>`` (one episode turn by turn).

They are ``molt-env view``'s pages (``env_registry.hub.viewer``: the same index, filters, paging, templates and
policy), over the directory the registry keeps an eval's ``samples.jsonl`` in
(``LocalRegistry.publish_eval_samples``), under the hub's header, access rule and error pages. Everything in the
samples is the uploader's text and is escaped; the pages run no script (the viewer's Content-Security-Policy).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from env_registry.errors import Error
from env_registry.hub import viewer
from env_registry.hub.pages import PageRoute
from env_registry.store.local import LocalRegistry, NotFound

RUNS = viewer.Runs(keep=8)  # the indexes of the runs this server process showed last


class InvalidSamples(Error, ValueError):
    """An uploaded ``samples.jsonl`` that is not the episodes of the eval it is sent for (HTTP 400)."""


def check_samples(path: Path, env_id: str) -> None:
    """Refuse a ``samples.jsonl`` that is not the episodes of one eval of ``env_id``: a line that is not a sample
    record, another env's record, or no record at all (read as the viewer indexes it: no line parsed twice).

    Raises:
        InvalidSamples: naming what is wrong.
    """
    index = viewer.Index(path, {})
    if index.bad:
        raise InvalidSamples(f"{index.bad} line(s) of the uploaded samples are not sample records of `molt-env eval`")
    if not len(index):
        raise InvalidSamples("the uploaded samples hold no episode")
    others = sorted(set(index.envs) - {env_id})
    if others:
        raise InvalidSamples(f"the eval is of {env_id!r}; the uploaded samples hold episodes of {others[0][:300]!r}")


def eval_router() -> APIRouter:
    """The routes of the uploaded evals' pages (they read the app's ``state.registry``)."""
    router = APIRouter(route_class=PageRoute, tags=["hub pages"], default_response_class=HTMLResponse)

    def run(request: Request, eval_id: int) -> tuple[tuple[viewer.Index, dict], dict]:
        registry: LocalRegistry = request.app.state.registry
        record = registry.eval_record(eval_id)
        if not record.samples:
            raise NotFound(
                f"eval {eval_id} ({record.env_id}, {record.package} {record.version}) has a summary but no episodes: "
                "`molt-env eval ... --out DIR --publish-results` uploads them"
            )
        back = {
            "href": f"/envs/{quote(record.env_id, safe='/')}?version={quote(record.version)}#evals",
            "label": f"{record.env_id} ({record.package} {record.version}): eval {eval_id} of "
            f"{record.summary.get('model')}",
        }
        where = {"base": f"/evals/{eval_id}", "root": "", "back": back}
        return RUNS.get(registry.eval_dir(eval_id)), where

    @router.get("/evals/{eval_id}/")
    def eval_index(
        request: Request,
        eval_id: int,
        env: str = "",
        reward: str = "",
        failure: str = "",
        min_len: str = "",
        max_len: str = "",
        page_number: int = Query(1, alias="page"),
    ) -> HTMLResponse:
        """An uploaded eval's summary and episodes, filtered and paged as ``molt-env view`` does."""
        loaded, where = run(request, eval_id)
        filters = {"env": env, "reward": reward, "failure": failure, "min_len": min_len, "max_len": max_len}
        return viewer.index_page(request, loaded, filters, page_number, **where)

    @router.get("/evals/{eval_id}/episodes/{i}")
    def eval_episode(request: Request, eval_id: int, i: int) -> HTMLResponse:
        """One episode of an uploaded eval, turn by turn."""
        loaded, where = run(request, eval_id)
        return viewer.episode_page(request, loaded, i, **where)

    return router
