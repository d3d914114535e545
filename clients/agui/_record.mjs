// What a run showed a subscriber: every event as received (after the
// client's own validation) and what onRunFinishedEvent was given.
export function recorder(runs) {
  const run = { events: [], finished: null };
  runs.push(run);
  const subscriber = {
    onEvent({ event }) {
      run.events.push(event);
    },
    onRunFinishedEvent(params) {
      run.finished = {
        outcome: params.outcome,
        pendingToolCallIds: params.pendingToolCallIds ?? null,
        interrupts: params.interrupts ?? null,
      };
    },
  };
  return { run, subscriber };
}

export function errorText(error) {
  return String(error && error.message ? error.message : error);
}
