"""Standard span, counter and track names recorded by agentax.

Every layer instruments itself with these constants so that the Perfetto timeline reads the
same in every run and `agentax doctor` can find what it measures. A name is a plain string;
other teams may record extra names, the doctor simply ignores names it does not know.

Args keys the doctor reads (all optional) are listed at the bottom (`ARG_*`).
"""

# --- spans -------------------------------------------------------------------------------
ROLLOUT = "rollout"  # one group of episodes for a task (collector side)
EPISODE = "episode"  # one episode, on its own track `episode_track(id)`; flow_out -> TRAIN_STEP
MODEL_CALL = "model_call"  # agent -> engine generate call, queueing for a slot included
ENV_RESET = "env_reset"
ENV_STEP = "env_step"
TOOL_CALL = "tool_call"
REWARD = "reward"
TRAIN_STEP = "train_step"  # one optimizer step; flow_in = the flows of the episodes it consumed
SFT = "sft"  # the SFT warm start, one span over all its steps (trainer track; args `steps`)
WEIGHT_PUBLISH = "weight_publish"
TRAINER_WAIT = "trainer_wait"  # trainer blocked waiting for a complete group
PRODUCER_BLOCKED = "producer_blocked"  # collector blocked on a full group queue (back-pressure)
STALENESS_WAIT = "staleness_wait"  # collector blocked: would exceed max_staleness
PREFILL = "prefill"  # engine prefill of new requests into free slots (engine track)
DECODE_STEP = "decode_step"  # one batched decode step of all active slots (engine track)
DEVICE_CALL = "device_call"  # default name for `Tracer.device_span`
HOST_INFO = "host_info"  # instant at `Tracer.start`: cpu_cores, jax_backend, jax_devices
GROUP_DROPPED = "group_dropped"  # instant (collector track): a group the filters dropped;
# args `reason` (all_equal_rewards, ...), `task_id`, `episodes`
BROWSER_LAUNCH = "browser_launch"  # a BrowserEnvironment starts its worker's Chromium
BROWSER_NAVIGATE = "browser_navigate"  # a page load (inside env_reset / env_step)
BROWSER_ACTION = "browser_action"  # one click / type / ... on the page
BROWSER_OBSERVE = "browser_observe"  # the text view of the page built for the model
BROWSER_SPANS = (BROWSER_LAUNCH, BROWSER_NAVIGATE, BROWSER_ACTION, BROWSER_OBSERVE)

# --- counters ----------------------------------------------------------------------------
ENGINE_ACTIVE_SLOTS = "engine_active_slots"
ENGINE_WAITING = "engine_waiting"  # requests waiting for a free slot
ENGINE_EVICTIONS = "engine_evictions"
QUEUE_DEPTH = "queue_depth"  # complete groups waiting for the trainer
STALENESS = "staleness"  # policy versions behind, one sample per trained trajectory/group

# --- tracks ------------------------------------------------------------------------------
ENGINE_TRACK = "engine"
TRAINER_TRACK = "trainer"
COLLECTOR_TRACK = "collector"
EPISODE_TRACK_PREFIX = "episode/"

# --- args keys the doctor reads -------------------------------------------------------------
ARG_EPISODE_ID = "episode_id"  # on EPISODE
ARG_STATUS = "status"  # on EPISODE: trajectory status (ok, timeout, env_error, ...)
ARG_POLICY_VERSION = "policy_version"  # on TRAIN_STEP / WEIGHT_PUBLISH: version after the step
ARG_STALENESS = "staleness"  # on TRAIN_STEP: max staleness of the consumed groups (fallback)
ARG_ERROR = "error"  # a span's exception (set by the tracer); on TOOL_CALL: why it failed
ARG_ROLE = "role"  # on MODEL_CALL of a multi-agent episode: the role that called the model
ARG_ROLE_REWARDS = "role_rewards"  # on EPISODE of a multi-agent episode: role -> reward
ARG_OK = "ok"  # on TOOL_CALL: whether the call succeeded (ToolResult.ok)


def episode_track(episode_id: object) -> str:
    """The custom track name of one episode, e.g. ``episode/17``."""
    return f"{EPISODE_TRACK_PREFIX}{episode_id}"
