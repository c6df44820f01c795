"""Where the day's feeds come from: a folder archive (default, bundled) or live URLs.

Archive: `FLYWHEEL_FEEDS_ARCHIVE/YYYY-MM-DD/*.xml` (default `sample_data/feeds_archive`).
Live: `FLYWHEEL_FEED_URLS`, comma-separated http(s) URLs, fetched with a timeout and a size
cap. Each live feed's raw bytes are kept under `$FLYWHEEL_DATA_DIR/raw/feeds/D/` with a
`manifest.json` of sha256 sums; a later run of the same day replays those files instead of
fetching again (the live feed has moved on by then), unless `refetch` is set. A feed that failed
(or a URL added since) left nothing to replay, so a later run fetches it: that is how a day whose
feeds failed is recovered.
Only http(s) URLs are fetched: urllib would open file:// too, but local feed files are the
archive's job (a URL setting should not read the machine's files).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from outcome_flywheel.daily_rl.feeds.headlines import RawFeed, sha256_bytes
from outcome_flywheel.settings import feed_url_problem, resolve_path
from outcome_flywheel.storage import atomic_write_bytes

DEFAULT_ARCHIVE = "sample_data/feeds_archive"
USER_AGENT = "outcome-flywheel/0.1 (+feedparser)"


def _slug(url: str) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "-", url.split("://", 1)[-1]).strip("-")[:60]
    return f"{base}-{hashlib.sha256(url.encode()).hexdigest()[:8]}.xml"


@dataclass
class FeedSource:
    """The day's raw feeds, from the archive folder or from live URLs (kept for replay)."""

    archive_dir: str = field(
        default=DEFAULT_ARCHIVE, metadata={"help": "FLYWHEEL_FEEDS_ARCHIVE: folder of YYYY-MM-DD/*.xml."}
    )
    feed_urls: str = field(
        default="", metadata={"help": "FLYWHEEL_FEED_URLS: comma-separated http(s) feed URLs; when set, live mode."}
    )
    max_headlines: int = field(default=30, metadata={"help": "FLYWHEEL_MAX_HEADLINES: headlines kept per day."})
    min_headlines: int = field(
        default=1,
        metadata={
            "help": (
                "FLYWHEEL_MIN_HEADLINES: a day with fewer headlines fails the blocking minimum_headlines check, "
                "so that day's daily_update does not run; 0 turns the check off."
            )
        },
    )
    timeout_s: float = field(default=20.0, metadata={"help": "Live fetch timeout per feed, seconds."})
    max_bytes: int = field(
        default=5_000_000, metadata={"help": "Live fetch size cap per feed; larger feeds are quarantined."}
    )
    refetch: bool = field(
        default=False, metadata={"help": "Live mode: fetch again even when the day's raw files are kept."}
    )
    data_dir: str = field(default="./data", metadata={"help": "FLYWHEEL_DATA_DIR (raw feeds go to raw/feeds/D/)."})

    @property
    def live(self) -> bool:
        return bool(self.urls())

    def urls(self) -> list[str]:
        return [u.strip() for u in self.feed_urls.split(",") if u.strip()]

    def raw_dir(self, day: str) -> Path:
        return resolve_path(self.data_dir) / "raw" / "feeds" / day

    def describe(self) -> str:
        return f"live: {len(self.urls())} URLs" if self.live else f"archive: {resolve_path(self.archive_dir)}"

    def describe_day(self, day: str) -> str:
        """Where `day`'s feeds come from: its archive folder, or the live URLs."""
        return (
            f"live: {', '.join(self.urls())}" if self.live else f"archive folder {resolve_path(self.archive_dir) / day}"
        )

    def fetch(self, day: str) -> list[RawFeed]:
        """The raw feeds of `day` (YYYY-MM-DD). Never raises for one bad feed: it comes back with `error`."""
        return self._live(day) if self.live else self._archive(day)

    # -- archive -------------------------------------------------------------------------
    def _archive(self, day: str) -> list[RawFeed]:
        folder = resolve_path(self.archive_dir) / day
        feeds = []
        for path in sorted(folder.glob("*.xml")) if folder.is_dir() else []:
            try:
                data = path.read_bytes()
                feeds.append(RawFeed(path.name, data, sha256_bytes(data), str(path)))
            except OSError as err:
                feeds.append(RawFeed(path.name, None, path=str(path), error=f"{type(err).__name__}: {err}"))
        return feeds

    # -- live ----------------------------------------------------------------------------
    def _live(self, day: str) -> list[RawFeed]:
        folder = self.raw_dir(day)
        manifest_path = folder / "manifest.json"
        kept = {}
        if manifest_path.exists() and not self.refetch:
            kept = {item["url"]: item for item in json.loads(manifest_path.read_text()) if item.get("file")}
        feeds, manifest = [], []
        for url in self.urls():
            if url in kept:
                feeds.append(self._replay_one(folder, kept[url]))
                manifest.append(kept[url])
                continue
            feed = self._fetch_one(url)
            name = _slug(url)
            if feed.data is not None:
                path = folder / name
                atomic_write_bytes(path, feed.data)
                feed.path = str(path)
            manifest.append(
                dict(url=url, file=name if feed.data is not None else None, sha256=feed.sha256, error=feed.error)
            )
            feeds.append(feed)
        atomic_write_bytes(manifest_path, json.dumps(manifest, indent=1).encode())
        return feeds

    def _replay_one(self, folder: Path, item: dict) -> RawFeed:
        path = folder / item["file"]
        data = path.read_bytes() if path.exists() else None
        if data is None or sha256_bytes(data) != item["sha256"]:
            # Not fetched again: the day's data would silently change; `refetch` is the deliberate way.
            return RawFeed(
                item["url"],
                None,
                path=str(path),
                error="kept raw file missing or sha256 mismatch (set refetch to fetch again)",
            )
        return RawFeed(item["url"], data, item["sha256"], str(path))

    def _fetch_one(self, url: str) -> RawFeed:
        problem = feed_url_problem(url)
        if problem:
            return RawFeed(
                url,
                None,
                error=f"{problem}: not fetched; live mode reads only http(s) feeds "
                f"(local feed files go in FLYWHEEL_FEEDS_ARCHIVE/YYYY-MM-DD/)",
            )
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = response.read(self.max_bytes + 1)
        except Exception as err:  # network errors of every kind become a quarantine row
            return RawFeed(url, None, error=f"{type(err).__name__}: {err}"[:300])
        if len(data) > self.max_bytes:
            return RawFeed(url, None, error=f"larger than the {self.max_bytes}-byte cap")
        return RawFeed(url, data, sha256_bytes(data))
