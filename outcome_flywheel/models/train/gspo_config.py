"""The GSPO trainer's settings and examples (TRL style: a Config dataclass beside the trainer, each
field's default and help written once). Plain Python: importing this imports neither torch nor mlx.

Two objectives over the same rollouts, every log-prob at the rollouts' sampling temperature (logits
/ T, before top-k / top-p, as TRL's GRPO and verl), response tokens only:

`token` (the default): each reward part is trained through the ratio that fits its span. The
whole-note part N_i (structure, judge rank, people: one number per note) goes through GSPO's
length-normalised sequence ratio and its narrow band; the parts that judge a span of the note (`price`
and `relevance`: the trade call's line) give each token t of note i an advantage A_it (zero outside
their span; `daily_rl/reward/signals.py`) and go through the per-token ratio r_it = pi_theta / pi_old at t:

    loss = sum_it m_it [ -w_it min(r_it A_it, clip(r_it, 1 - eps_low, 1 + eps_high) A_it) + beta k3_it ] / Z
         + sum_i |y_i| (-w_i min(s_i N_i, clip(s_i, 1 - seq_low, 1 + seq_high) N_i)) / Z

- the span parts are clipped per token, as PPO/GRPO do and as DAPO (Yu et al. 2025, "DAPO: An Open-Source
  LLM Reinforcement Learning System at Scale") keeps it: its token-level loss, and its clip-higher band
  eps_low = 0.2, eps_high = 0.28. A one-token decision (the side of a call, " Buy" / " Sell") moves its
  own ratio, not a length-normalised mean over the note that the sequence clip cuts at ~2%;
- Z is a constant (the minibatch's sequences x the longest response of the update), Dr. GRPO's
  normalisation (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): no
  division by each note's own length, so a token's pull does not depend on how long its note is. It is
  one normaliser for every part: the sequence term counts each note |y_i| times, so at s_i = 1 its pull
  on each token is N_i / Z, as a span part's is A_it / Z, and each part weighs its declared share (with
  a per-note mean, the whole-note part weighed ~2x its share on the side token: longest / |y_i|);
- the whole-note part keeps GSPO's sequence ratio s_i and band (seq_low 3e-4, seq_high 4e-4): at the
  token level a judge's rank on every token of the note, at DAPO's band and this learning rate,
  collapsed single tokens' probabilities by up to 1e5 within a day (measured on tiny-local) and
  drowned the call's line;
- w_it = min(pi_old / pi_behaviour at token t, tis_cap), the truncated IS weight per token (TIS), a
  constant (w_i: the sequence's, length-normalised): 1 for notes the parent sampled, the correction for
  notes sampled days before (prices);
- k3_it = exp(q_it) - 1 - q_it with q_it = log pi_ref - log pi_theta, Schulman's k3 estimator of
  KL(pi_theta || pi_ref) per token (non-negative, unbiased under pi_theta's samples), as TRL's GRPO;
  pi_ref = the base model (the LoRA adapter switched off).

`gspo` (Zheng et al. 2025, "Group Sequence Policy Optimization"), for whole-note signals only:

    s_i  = (pi_theta(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(mean_t(log pi_theta - log pi_old))
    loss = mean_i  -w_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i) + beta mean_i mean_t k3_it

with the paper's band 3e-4 / 4e-4 and w_i = min(exp(mean_t(log pi_old - log pi_behaviour)), tis_cap).
A note's advantage must then be one number per note (the trainer refuses span-scoped parts).

The counterfactual side term (`GSPOExample.counterfactual`, off unless `price_counterfactual_c` > 0): a
matured call's other side has a known outcome too, so its side decision trains on both actions, the
all-action policy gradient (Sutton et al. 2000, "Policy Gradient Methods for RL with Function
Approximation", its sum over actions; Ciosek & Whiteson 2018, "Expected Policy Gradients"):

    loss += -sum_i sum_{a in {own, other}} c_ia pi_theta(a | x_i, prefix_i) / Z,   c_i,own = -c_i,other

pi_theta(a | ...) = the product of the side phrase's token probabilities after the note's own prefix,
the other side's row teacher-forced (`daily_rl/reward/counterfactual.py`), in the first
`counterfactual_epochs` epochs. The same term over a judged call's name (off unless
`relevance_counterfactual_c` > 0): a judged call's name against another company's (relevance 1 and 0: the
headline's company for a call on another one, a decoy of the day for a call on it), so the name trains
toward the headline whatever was sampled.

`counterfactual_form` `pair` trains the same two rows through a logistic loss on the pair instead, the better
action preferred (DPO's pair loss, Rafailov et al. 2023, "Direct Preference Optimization", without a reference):

    loss += -sum_i |c_i| log sigmoid(sign(c_i) (log pi_theta(own_i | ...) - log pi_theta(other_i | ...))) / Z

The all-action gradient on an action is proportional to its probability: a side the policy seldom writes (0.05
against 0.3-0.5 for the one it favours, SmolLM2's notes) barely moves, whatever its outcome. The pair's pull is
(1 - the better action's share of the two) times |c|, so it does not shrink with a rare action's probability and
stops once the better action holds the pair.

`centered_pair` takes the same pair on the side's margin toward long, m_i = d_i (l_own,i - l_other,i) (d_i = +1
where the sampled side is long, -1 short), less the minibatch's mean over its side pairs:

    loss += -sum_i |c_i| log sigmoid(sign(c_i) d_i (m_i - mean_j m_j)) / Z

Adding the same delta to every m_i leaves it unchanged, so its gradient along a shift of every side margin is 0:
it trains how the side differs between headlines, and no lean (under `pair`, SmolLM2's `inverted` notes went to
Sell on every headline rather than reverse: docs/models.md). Name pairs (d = 0) stay uncentred.

Neither form holds the lean in practice: replayed one day at a time (`benchmarks/lean_source.py`), the pair term
alone moved every held-out side margin by 2-3 nats at once, centred or not (AdamW scales each weight's step
by its own history, so a gradient with no component along the lean still takes a step with one). The lean anchor
(`side_lean_anchor` = lambda > 0, under either pair form) penalises that move itself:

    loss += lambda (mean_j d_j (x_j - x_old,j))^2,   x = l_own - l_other,  x_old: the same at pi_old

over the minibatch's side pairs, so what the earlier steps of the day moved every side by is pulled back.

The anchor holds the lean where the day began, which is the base's lean after a few days. The lean target
(`side_lean_target` = mu > 0, either pair form) trains the lean from the outcomes instead:

    loss += mu KL(p || sigmoid(mean_j d_j x_j))

p = the share of the update's side pairs where long did better (one win and one loss added), the mean margin
toward long pulled to logit(p): the lean the day's matured calls (and the pooled older ones) ask for, where
`centered_pair` trains how each headline's side differs from it.

Off-policy by days (notes trained when their price matures, sampled by an older checkpoint): pi_old
is the policy the update starts from (recomputed); the TIS weight corrects for the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outcome_flywheel.models.interface import LoraSettings, Messages

OBJECTIVES = ("token", "gspo", "reward_weighted")
# The clip band each objective is written with: DAPO's clip-higher per token, the GSPO paper's per sequence.
DEFAULT_CLIP = {"token": (0.2, 0.28), "gspo": (3e-4, 4e-4), "reward_weighted": (3e-4, 4e-4)}
OLD_LOGPROBS = ("auto", "stored", "recompute")
PART_NORMALISERS = ("shared", "per_part")
COUNTERFACTUAL_FORMS = ("probability", "pair", "centered_pair")  # how the counterfactual term trains its two rows
KL_SPANS = ("note", "ticker")  # the tokens the KL penalty covers (`kl_span`)
KL_ESTIMATORS = ("k3", "exact")  # how it is taken there (`kl_estimator`)
FROZEN_SPANS = (None, "ticker")  # tokens no part of the loss trains (`frozen_span`)


@dataclass
class GSPOConfig:
    """GSPO settings; the one source of truth for their defaults."""

    objective: str = field(
        default="token",
        metadata={
            "help": "`token`: the token-level clipped surrogate over signal-scoped advantages (DAPO's loss and clip-higher, Dr. GRPO's constant normaliser); `gspo`: the clipped sequence ratio (whole-note signals only); `reward_weighted`: -A_i * mean_t log pi_theta (the original loop's update, GSPO's gradient at ratio 1)."
        },
    )
    learning_rate: float = field(
        default=2e-3,
        metadata={
            "help": "AdamW learning rate. LoRA on tiny-local needs a large step to move in one epoch a day (benchmarks/daily_learning.py); for a 0.6B+ model start near 1e-5 (full) / 1e-4 (LoRA). In the daily loop 0 freezes the policy: the day takes no step and no gate, and records not_trained."
        },
    )
    epsilon_low: float | None = field(
        default=None,
        metadata={
            "help": "Lower clip band of the ratio, 1 - eps_low; None = the objective's own: 0.2 per token (`token`, DAPO), 3e-4 per sequence (`gspo`, the paper)."
        },
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip band of the ratio, 1 + eps_high; None = the objective's own: 0.28 per token (`token`, DAPO's clip-higher), 4e-4 per sequence (`gspo`)."
        },
    )
    sequence_epsilon_low: float = field(
        default=3e-4,
        metadata={
            "help": "`token` objective: lower band of the whole-note part's sequence ratio (GSPO's, the paper's 3e-4)."
        },
    )
    sequence_epsilon_high: float = field(
        default=4e-4,
        metadata={"help": "`token` objective: upper band of the whole-note part's sequence ratio (the paper's 4e-4)."},
    )
    kl_beta: float = field(
        default=0.1,
        metadata={
            "help": "Weight beta of the KL-to-base penalty (pi_ref = the LoRA adapter switched off; where it is taken: `kl_span`, how: `kl_estimator`); 0 = none. The default 0.1 on the call's name, exactly: issue 46's ablation (docs/daily_rl.md, \"The ablation\") chose it over no anchor, which let held-out calls leave the headline's company, and over beta 0.25 and 1, which held the side down (opposite sides 0.76 and 0.70 against 0.815); k3 over every token at 0.04 (TRL's old GRPO default) and 0.01 left the sides unmoved in 11 days. A full fine-tune (lora=None) holds no base in memory and trains without it (recorded as kl_reference)."
        },
    )
    kl_span: str = field(
        default="ticker",
        metadata={
            "help": "Tokens the KL penalty covers: `note` (every response token) or `ticker` (the call's named symbol only, `GSPOExample.name_mask`; the default): an anchor on which company the notes call that leaves the side and the prose free to move."
        },
    )
    kl_estimator: str = field(
        default="exact",
        metadata={
            "help": "How the KL penalty is taken: `k3` (Schulman's estimator on the sampled token, from the no-grad pass of the base) or `exact` (the default: KL(pi_theta || pi_ref) summed over the whole vocabulary at each position, the sampled token's rivals included; one more forward of the policy and of the base over the notes that name a symbol). `exact` takes `kl_span: ticker`: an anchor on the whole distribution of names, where k3's pull on a name the policy pushed far below the base grows as exp(log pi_ref - log pi) (docs/daily_rl.md)."
        },
    )
    frozen_span: str | None = field(
        default=None,
        metadata={
            "help": "Tokens no part of the loss trains: `ticker` (the call's named symbol, `GSPOExample.name_mask`) leaves them out of every part's tokens, so the names the policy writes move only through what the other tokens' updates share; None = none, the default. The relevance part, which trains the ticker, then trains only notes without a call line, and the KL anchor on the names (`kl_span` ticker) is off."
        },
    )
    batch_size: int = field(default=16, metadata={"help": "Sequences per padded minibatch (one AdamW step each)."})
    epochs: int = field(
        default=4,
        metadata={
            "help": 'Passes over the examples. 4: in a `news` world on tiny-local, 1 epoch left the sides where the base had them after 11 days, 4 moved them (docs/daily_rl.md, "Credit"); the per-token band bounds each pass.'
        },
    )
    part_normaliser: str = field(
        default="shared",
        metadata={
            "help": "How the reward parts are normalised (objective `token`): `shared` = one Z for every part (the minibatch's sequences x the longest response: each token's pull is share x A / Z, so a part's weight in the update grows with the tokens it spans: the note part, on every token, outweighs the one-token side); `per_part` = each part over its own tokens in the minibatch (the note part over the notes' tokens, relevance and price over their spans': each part's loss is share x its mean per-token surrogate, so a part weighs its declared share whatever its span's length)."
        },
    )
    span_epochs: int | None = field(
        default=None,
        metadata={
            "help": "A per-day trust region for the span-scoped parts (price, relevance: the call's tokens): they train in the first N epochs only, the whole-note part in all of them; None = every epoch, the default: at 1 the sides did not learn on a 2 x 2 grid of 16 days on tiny-local (docs/daily_rl.md, the ablation)."
        },
    )
    counterfactual_epochs: int = field(
        default=1,
        metadata={
            "help": "Epochs (the first N) whose minibatches carry the counterfactual term of the examples that have one (the side: `price_counterfactual_c` > 0; the name: `relevance_counterfactual_c` > 0): a trust region on it, as the probe's arm asked (issue 46)."
        },
    )
    counterfactual_form: str = field(
        default="probability",
        metadata={
            "help": "How the counterfactual term trains a decision's two rows: `probability` = -c sum_a pi(a) (R(a) - R_bar), the all-action policy gradient, whose pull on an action shrinks with its probability (the default: issue 46's ablation on tiny-local); `pair` = -|c| log sigmoid(+-(log pi(own) - log pi(other))), the better action preferred (DPO's pair loss without a reference), whose pull does not; `centered_pair` = the pair on each side's long-minus-short margin less the minibatch's mean one (name pairs uncentred): a shift of every side margin at once leaves it unchanged, so it trains only how the side differs between headlines, not a lean to one side."
        },
    )
    side_lean_anchor: float = field(
        default=0.0,
        metadata={
            "help": "lambda of the lean anchor (`pair` and `centered_pair` forms): lambda (mean over the minibatch's side pairs of d_i (x_i - x_old,i))^2, x = log pi(own side) - log pi(other side) now and x_old at pi_old, d_i = +1 own long, -1 own short: pulls back the move of every side margin toward one side that the pair term's steps make (2-3 nats a day on SmolLM2, centred or not: docs/models.md); costs one no-grad forward of the other sides' rows. Under AdamW a controller, not a soft bound: at lr 1e-3 on SmolLM2, lambda 0.1 and above overshot (the minibatch's lean swung +-3.7 nats a step); 0.01 kept it within +-1.7 nats and took the held-out lean out on two of four replayed days, made one on another and cost gap on two: mixed, so 0 = off, the default."
        },
    )
    side_lean_target: float = field(
        default=0.0,
        metadata={
            "help": "mu of the lean target (`pair` and `centered_pair` forms): mu KL(p || sigmoid(M)), M = the minibatch's mean side margin toward long (mean over its side pairs of d_i (log pi(own side) - log pi(other side))), p = the share of the update's side pairs where long did better, with one win and one loss added: the lean is trained toward logit(p), what the outcomes ask for, instead of left to the pair term's walk or held where the day began (the anchor). At 0.05 on SmolLM2 (one training seed, both worlds) the world's part grew half as much as without it and the sampled side did not improve (docs/models.md): 0 = off, the default."
        },
    )
    gradient_shares: bool = field(
        default=True,
        metadata={
            "help": "Measure each reward part's share of the update's gradient (note, relevance, price, and the counterfactual side term where notes carry it) on a probe minibatch drawn across the day's examples, before the first step (one extra backward pass a part); not under data parallel (each rank forwards its shard only)."
        },
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip."})
    lora: LoraSettings | None = field(
        default_factory=LoraSettings,
        metadata={"help": "LoRA rank, alpha, dropout and target modules of a fresh adapter; None = full fine-tune."},
    )
    seed: int = field(
        default=0,
        metadata={
            "help": "Shuffles the minibatch order (the LoRA init draws from the framework's generator, seeded by the caller)."
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "The rollouts' sampling temperature: logits are divided by it in the pi_old and pi_theta passes."
        },
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={
            "help": "A headline's rollouts share its prompt: keep a prompt group in one minibatch and (torch) run the prompt once, expanding its KV cache (gradients flow through it)."
        },
    )
    trim_unread_tail: bool = field(
        default=False,
        metadata={
            "help": "Forward each note only up to the last token a loss term reads (its span advantages, the counterfactual's own action, the call's name) when nothing reads the rest: objective `token`, a whole-note advantage of 0 (its part off or flat), no KL over the whole note (`kl_span` note). The model is causal and Dr. GRPO's normaliser keeps the sampled lengths, so the loss and gradient are the uncut ones (to float rounding) for fewer tokens: under `call_first` the call line opens a note. Per-sequence diagnostics (`behavior_logprob_gap_max`, the replayed notes' IS ratios, ratio_mean, mean_logp) then cover the kept tokens. Off by default: a minibatch is padded to its longest note, and on SmolLM2's days (2-core CPU) a note without a call, kept whole, sat in nearly every one, so two replayed days took no less time (docs/models.md)."
        },
    )
    one_at_a_time: bool = field(
        default=False,
        metadata={"help": "The original loop's way, one sequence per forward and step (for the benchmark)."},
    )
    tis_cap: float | None = field(
        default=2.0,
        metadata={
            "help": "Truncation cap C of the behaviour IS weight min(pi_old / pi_behaviour, C): per token (`token`), per sequence as a length-normalised ratio (`gspo`); TRL's and verl's default cap 2.0; None = no correction. Needs recomputed pi_old."
        },
    )
    old_logprobs: str = field(
        default="recompute",
        metadata={
            "help": "pi_old: `recompute` = one no-grad pass of the training forward over the behaviour policy before the first step (ratio exactly 1 in any precision); `stored` = the behaviour log-probs saved at generation (within 1e-4 in fp32, off by more than the clip band in bf16); `auto` = stored in fp32, recomputed otherwise."
        },
    )

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs must be auto | stored | recompute, got {self.old_logprobs!r}")
        if self.tis_cap is not None and not (self.tis_cap >= 1.0 and self.tis_cap < float("inf")):
            raise ValueError(f"tis_cap must be a finite number >= 1 (or None), got {self.tis_cap}")
        if not (isinstance(self.kl_beta, (int, float)) and 0.0 <= float(self.kl_beta) < float("inf")):
            raise ValueError(f"kl_beta must be a finite number >= 0, got {self.kl_beta!r}")
        if self.kl_span not in KL_SPANS:
            raise ValueError(f"kl_span must be one of {', '.join(KL_SPANS)}, got {self.kl_span!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if self.kl_estimator == "exact" and self.kl_span != "ticker":
            raise ValueError(
                f"kl_estimator 'exact' takes kl_span 'ticker' (the call's name), not {self.kl_span!r}: over every "
                "token of a note the whole vocabulary's log-probs would not fit the memory plan (for a KL over the "
                "note, set kl_estimator 'k3')"
            )
        if self.frozen_span not in FROZEN_SPANS:
            raise ValueError(f"frozen_span must be one of {FROZEN_SPANS}, got {self.frozen_span!r}")
        for name in ("epsilon_low", "epsilon_high", "sequence_epsilon_low", "sequence_epsilon_high"):
            value = getattr(self, name)
            if value is not None and not (
                0.0 <= float(value) < 1.0 if name.endswith("low") else 0.0 <= float(value) < float("inf")
            ):
                raise ValueError(f"{name} must be >= 0 (and epsilon_low < 1), got {value!r}")
        if self.part_normaliser not in PART_NORMALISERS:
            raise ValueError(f"part_normaliser must be one of {PART_NORMALISERS}, got {self.part_normaliser!r}")
        if self.span_epochs is not None and (
            isinstance(self.span_epochs, bool) or int(self.span_epochs) != self.span_epochs or self.span_epochs < 1
        ):
            raise ValueError(f"span_epochs must be a whole number >= 1 (or None), got {self.span_epochs!r}")
        if (
            isinstance(self.counterfactual_epochs, bool)
            or int(self.counterfactual_epochs) != self.counterfactual_epochs
            or self.counterfactual_epochs < 1
        ):
            raise ValueError(f"counterfactual_epochs must be a whole number >= 1, got {self.counterfactual_epochs!r}")
        if self.counterfactual_form not in COUNTERFACTUAL_FORMS:
            raise ValueError(
                f"counterfactual_form must be one of {', '.join(COUNTERFACTUAL_FORMS)}, got {self.counterfactual_form!r}"
            )
        # The lean terms read the side pairs' margins, which only the pair forms build
        for name, what in (
            ("side_lean_anchor", "holds the side pairs' margins"),
            ("side_lean_target", "trains the side pairs' mean margin"),
        ):
            weight = getattr(self, name)
            if not (0.0 <= float(weight) < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {weight!r}")
            if weight and self.counterfactual_form not in ("pair", "centered_pair"):
                raise ValueError(
                    f"{name} {what}: use counterfactual_form 'pair' or 'centered_pair', not {self.counterfactual_form!r}"
                )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {self.temperature}")

    def clip_band(self) -> tuple[float, float]:
        """(eps_low, eps_high) in force: the ones set, else the objective's own (`DEFAULT_CLIP`)."""
        low, high = DEFAULT_CLIP[self.objective]
        return (
            low if self.epsilon_low is None else float(self.epsilon_low),
            high if self.epsilon_high is None else float(self.epsilon_high),
        )


@dataclass(frozen=True)
class Counterfactual:
    """One decision's two actions, for the counterfactual term (`daily_rl/reward/counterfactual.py`): a matured
    call's two sides (price examples) or a judged call's name and the headline's company (judged examples)."""

    own_mask: list[bool] = field(metadata={"help": "Per response token: the sampled action's tokens."})
    other_response_ids: list[int] = field(
        metadata={"help": "The note's tokens up to the decision, then the other action's (teacher-forced)."}
    )
    other_mask: list[bool] = field(metadata={"help": "Per other-row token: the other action's tokens."})
    coefficient: float = field(
        metadata={
            "help": "c (R(own) - R_bar), R_bar = the two actions' mean (a side's: x the replay weight): the own action's coefficient; the other's is its negative."
        }
    )
    direction: int = field(
        default=0,
        metadata={
            "help": "+1 where the own action is the long side, -1 the short side, 0 not a side (a name): the axis `centered_pair` centres the side's margins on."
        },
    )


@dataclass
class GSPOExample:
    """One rollout to train on."""

    prompt: Messages = field(metadata={"help": "The chat messages the response answers."})
    response_ids: list[int] = field(metadata={"help": "The sampled response's token ids."})
    behavior_logprobs: list[float] = field(
        metadata={"help": "Per response token, under the policy that sampled it, at its sampling temperature."}
    )
    advantage: float = field(
        metadata={
            "help": "The whole-note part: group-normalised reward within the headline's rollouts (times its share), trained through the sequence ratio."
        }
    )
    token_advantages: list[float] | None = field(
        default=None,
        metadata={
            "help": "The span-scoped parts per response token: the sum over them of share x group-normalised advantage x whether the token lies in the part's span (rewards.token_advantages), trained through the per-token ratio (objective `token`); None = none."
        },
    )
    token_part: str = field(
        default="relevance",
        metadata={
            "help": "Which reward part `token_advantages` carries: `relevance` (judged notes) or `price` (matured ones); for the gradient shares."
        },
    )
    counterfactual: Counterfactual | None = field(
        default=None,
        metadata={
            "help": "The counterfactual term's two rows: the side of a matured call on the headline's company (`token_part` price), the name of a judged call on another company (relevance); None = none."
        },
    )
    name_mask: list[bool] | None = field(
        default=None,
        metadata={
            "help": "True on the call's ticker tokens (credit.call_token_mask, span `ticker`): what `kl_span` `ticker` penalises; None = the note names no symbol."
        },
    )
