"""Which companies a note names: the tickers and company names the call parser and the relevance signal know
(every symbol of sample_data/prices plus a few large caps), and the candidates a text mentions."""

from __future__ import annotations

import re

_NAMES = {  # ticker -> "|"-separated names; every symbol of sample_data/prices plus a few large caps
    "AAPL": "Apple",
    "ABBV": "AbbVie",
    "AMGN": "Amgen",
    "AMZN": "Amazon|Amazon.com",
    "AXP": "American Express",
    "BA": "Boeing",
    "BAC": "Bank of America|BofA",
    "BLK": "BlackRock",
    "C": "Citigroup|Citi|Citibank",
    "CAT": "Caterpillar",
    "CMCSA": "Comcast",
    "COST": "Costco",
    "CRM": "Salesforce",
    "CSCO": "Cisco|Cisco Systems",
    "CVX": "Chevron",
    "DIS": "Disney|Walt Disney",
    "GE": "GE Aerospace|General Electric",
    "GOOGL": "Alphabet|Google",
    "GS": "Goldman Sachs|Goldman",
    "HD": "Home Depot",
    "IBM": "International Business Machines",
    "INTC": "Intel",
    "JNJ": "Johnson & Johnson|Johnson and Johnson|J&J",
    "JPM": "JPMorgan|JPMorgan Chase|JP Morgan|J.P. Morgan",
    "KO": "Coca-Cola|Coca Cola|Coke",
    "LLY": "Eli Lilly|Lilly",
    "LMT": "Lockheed Martin|Lockheed",
    "MCD": "McDonald's|McDonalds",
    "META": "Meta|Meta Platforms|Facebook",
    "MRK": "Merck",
    "MS": "Morgan Stanley",
    "MSFT": "Microsoft",
    "NFLX": "Netflix",
    "NKE": "Nike",
    "NOW": "ServiceNow",
    "NVDA": "Nvidia",
    "ORCL": "Oracle",
    "PEP": "PepsiCo|Pepsi",
    "PFE": "Pfizer",
    "PG": "Procter & Gamble|Procter and Gamble|P&G",
    "QCOM": "Qualcomm",
    "QQQ": "Invesco QQQ|Nasdaq-100 ETF|Nasdaq 100 ETF",
    "SPY": "SPDR S&P 500 ETF|SPDR S&P 500|S&P 500 ETF|SPDR",
    "T": "AT&T",
    "TMO": "Thermo Fisher|Thermo Fisher Scientific",
    "TXN": "Texas Instruments",
    "UNH": "UnitedHealth|UnitedHealth Group|United Health",
    "UPS": "United Parcel Service",
    "VZ": "Verizon",
    "WFC": "Wells Fargo",
    "WMT": "Walmart|Wal-Mart",
    "XOM": "Exxon Mobil|ExxonMobil|Exxon",
    "TSLA": "Tesla",
    "AVGO": "Broadcom",
    "AMD": "Advanced Micro Devices",
    "BRK-B": "Berkshire Hathaway",
    "V": "Visa",
    "MA": "Mastercard",
    "ADBE": "Adobe",
    "SBUX": "Starbucks",
    "GEV": "GE Vernova",
    "GEHC": "GE HealthCare",
    "MU": "Micron",
    "GM": "General Motors",
    "UBER": "Uber",
    "PLTR": "Palantir",
}


COMPANY_TICKERS: dict[str, str] = {n.lower(): t for t, names in _NAMES.items() for n in names.split("|")}


# Tickers that are also English words: read only in ticker form ($NOW, (T), NYSE: C), never bare.
_TICKER_FORM_ONLY = set(
    "A C T V F MA MS ALL ON NOW KEY LOW ARE CAN HAS ANY SEE WELL BIG ONE TWO GO BE SO DO UP".split()
)


# All-caps words that are never tickers (outside an exchange prefix): acronyms, note and market words.
_NOT_TICKERS = set(
    "I AN AND THE OR OF TO IN AT BY FOR IS IT AS IF NO NOT WE OUR BUT YES NEW OUT TOP HIGH AI US USA USD EUR GBP "
    "JPY CNY CEO CFO COO CTO EPS ETF ETFS IPO FDA SEC FTC DOJ EU UK GDP CPI PPI PCE FOMC FED ECB BOJ GPU GPUS CPU "
    "API EV EVS ESG YOY QOQ YTD FY TTM EBIT ROI ROE ROIC FCF PE PEG DCF ATH ATL RSI MACD SMA EMA VWAP ATR OTC NYSE "
    "AMEX LLC INC CORP LTD PLC CO OK NB PS RE VS ETA TBD NFA IMO FYI ASAP BPS PCT AUM NAV IRR OPEX CAPEX GAAP TAM "
    "SAAS LLM LLMS ML IP HR OEM SKU DTC ARPU KPI KPIS OPEC WTI LNG REIT SPAC NFT BTC ETH FX IV VIX SPX NDX DJIA DOW "
    "TL DR TLDR NA BUY SELL LONG SHORT HOLD TRADE NOTE RISK RISKS STOP LOSS SIZE TIME ENTRY EXIT PRICE NONE PASS "
    "WAIT AVOID BULL BEAR DOWN CALL CALLS PUT PUTS NEWS WEEK DAY DAYS Q".split()
)


_NAME_RE = re.compile(
    r"(?<![\w&])("
    + "|".join(re.escape(n).replace(r"\ ", r"\s+") for n in sorted(COMPANY_TICKERS, key=len, reverse=True))
    + r")(?![\w&])",
    re.IGNORECASE,
)


_T = r"[A-Z]{1,5}(?:[.-][A-Z])?"


_TICKER_RE = re.compile(
    rf"(?:NYSE\s*Arca|NYSEARCA|NYSE|NASDAQ|Nasdaq|AMEX|Cboe|CBOE)\s*:\s*(?P<ex>{_T})\b|\$(?P<dollar>{_T})\b"
    rf"|\(\s*(?P<paren>{_T})\s*[),]|(?<![\w$&'.-])(?P<bare>[A-Z]{{2,5}})(?![\w&]|[-.]\w)"
)


def mentions(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, ticker, form) for each symbol `text` writes, in order: `form` is "name" for a company
    name (start, end: the name) or the ticker form ("ex", "dollar", "paren", "bare"; start, end: the symbol's
    letters alone, so "$PFE" spans "PFE")."""
    found = []
    masked = list(text)
    for m in _NAME_RE.finditer(text):
        if m.group(0)[0].isalpha() and not m.group(0)[0].isupper():
            continue  # names are written capitalised; "apple" in prose is not Apple
        found.append((m.start(), m.end(), COMPANY_TICKERS[re.sub(r"\s+", " ", m.group(0).lower())], "name"))
        masked[m.start() : m.end()] = " " * (m.end() - m.start())  # so "GE Vernova" is not also GE
    for m in _TICKER_RE.finditer("".join(masked)):
        form, sym = m.lastgroup, m.group(m.lastgroup)
        if form == "bare" and (sym in _NOT_TICKERS or sym in _TICKER_FORM_ONLY):
            continue
        if form in ("dollar", "paren") and sym in _NOT_TICKERS and sym not in _TICKER_FORM_ONLY:
            continue
        if form == "paren" and len(sym) == 1 and (sym not in _TICKER_FORM_ONLY or sym == "A"):
            continue  # "(A)", "(B)" list items
        found.append((*m.span(form), sym.replace(".", "-"), form))
    return sorted(found)


def display_name(ticker: str) -> str | None:
    """The company's first listed name as written ("Pfizer" for PFE); None for a ticker the lists lack."""
    names = _NAMES.get(ticker)
    return names.split("|")[0] if names else None


def _candidates(text: str, universe: set[str] | None) -> list[tuple[int, str, bool, bool]]:
    """(position, ticker, known, strong) for each symbol in `text`. Strong: a company name or a ticker form
    ($X, (X), NYSE: X); a bare all-caps word is weak, as it may be jargon the lists do not cover."""
    return [(a, s, universe is None or s in universe, form != "bare") for a, _, s, form in mentions(text)]
