"""The market-data resource: daily closes from the bundled file (default) or yfinance."""

from outcome_flywheel.market_data import BUNDLED_PRICES, MarketData
from resources.settings import DataclassResource, env_or_default, mirrored


class MarketDataResource(DataclassResource[MarketData]):
    """Daily adjusted closes: an offline file (default: the bundled real prices) or yfinance."""

    plain = MarketData
    source: str = mirrored(MarketData, "source")
    prices_file: str = mirrored(MarketData, "prices_file")
    data_dir: str = mirrored(MarketData, "data_dir")
    retries: int = mirrored(MarketData, "retries")
    backoff_seconds: float = mirrored(MarketData, "backoff_seconds")

    @classmethod
    def from_env(cls) -> "MarketDataResource":
        return cls(
            source=env_or_default("FLYWHEEL_MARKET_DATA", "file"),
            prices_file=env_or_default("FLYWHEEL_PRICES_FILE", str(BUNDLED_PRICES)),
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
        )
