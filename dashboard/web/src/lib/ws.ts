"use client";

// useLiveSocket keeps one of the API's WebSockets open while a view is on
// screen: it reconnects with backoff after a drop (never after a normal
// close, a policy close or an error message), and asks the caller for the
// URL each time so a task's stream resumes from its last cursor.

import { useEffect, useRef, useState } from "react";

export type LiveStatus = "connecting" | "live" | "reconnecting" | "closed";

export function useLiveSocket(
  url: (() => string) | null,
  onMessage: (msg: Record<string, unknown>) => void,
  deps: unknown[],
): LiveStatus {
  const [status, setStatus] = useState<LiveStatus>("connecting");
  const handler = useRef(onMessage);
  handler.current = onMessage;
  const urlFn = useRef(url);
  urlFn.current = url;

  useEffect(() => {
    if (!urlFn.current) return;
    let stopped = false;
    let ws: WebSocket | null = null;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let failures = 0;
    const open = () => {
      if (stopped || !urlFn.current) return;
      ws = new WebSocket(urlFn.current());
      let finished = false;
      ws.onopen = () => {
        failures = 0;
        setStatus("live");
      };
      ws.onmessage = (ev) => {
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(String(ev.data));
        } catch {
          return;
        }
        if (msg.type === "end" || msg.type === "error") finished = true;
        handler.current(msg);
      };
      ws.onclose = (ev) => {
        if (stopped) return;
        // 1000 after a task's end, 1008 when the session expired, 1011
        // after an error message: reconnecting would not help.
        if (finished || ev.code === 1000 || ev.code === 1008 || ev.code === 1011) {
          setStatus("closed");
          return;
        }
        setStatus("reconnecting");
        failures++;
        const delay = Math.min(10000, 250 * 2 ** Math.min(failures, 6)) * (0.75 + Math.random() / 2);
        timer = setTimeout(open, delay);
      };
    };
    setStatus("connecting");
    open();
    return () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      ws?.close(1000);
    };
    // The caller lists what changes the stream (a task id, a filter).
  }, deps);
  return status;
}
