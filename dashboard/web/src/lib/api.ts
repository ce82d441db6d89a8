// The dashboard API's client: JSON over fetch with the session cookie,
// the CSRF header on changes, and the WebSocket URLs. Shapes follow
// dashboard/api/API.md.

export const apiBase = (process.env.NEXT_PUBLIC_API_BASE ?? "").replace(/\/+$/, "");

export type TaskState = "pending" | "scheduled" | "running" | "succeeded" | "failed" | "cancelled" | "timed_out";
export const taskStates: TaskState[] = ["pending", "scheduled", "running", "succeeded", "failed", "cancelled", "timed_out"];
export const terminalStates = new Set<string>(["succeeded", "failed", "cancelled", "timed_out"]);

export interface Session {
  signedIn: boolean;
  email?: string;
  role?: "admin" | "member";
  via?: "google" | "dev";
  expiresAt?: string;
  csrfToken: string;
  devSignIn: boolean;
  googleSignIn: boolean;
}

export interface AppliedSecurity {
  runtime?: string;
  runtimeVersion?: string;
  profile?: string;
  seccompMode?: string;
  seccompProfileSha256?: string;
  capabilities?: string[];
  netRawDropped?: boolean;
  noNewPrivileges?: boolean;
  maskedPaths?: string[];
  readonlyPaths?: string[];
  pathsNote?: string;
  apparmorProfile?: string;
  apparmorNote?: string;
  egressMode?: string;
  notes?: string[];
}

export interface Attempt {
  number: number;
  state: string;
  machineId?: string;
  scheduledAt?: string;
  startedAt?: string;
  finishedAt?: string;
  exitCode?: number;
  message?: string;
  reason?: string;
  summary?: string;
  droppedLines?: number;
  imageDigest?: string;
  appliedSecurity?: AppliedSecurity;
}

export interface Task {
  id: string;
  state: TaskState;
  image: string;
  command: string[];
  pool: string;
  cpuMillis?: number;
  memoryBytes?: number;
  gpus?: number;
  gpuType?: string;
  timeoutSeconds?: number;
  retries?: number;
  secrets?: string[];
  envNames?: string[];
  createdAt?: string;
  finishedAt?: string;
  exitCode?: number;
  message?: string;
  machineId?: string;
  appliedSecurity?: AppliedSecurity;
  attempts?: Attempt[];
  seccompLogged?: Array<{ syscall: string; count: number }>;
}

export interface TaskEvent {
  type: "event";
  cursor: string;
  time?: string;
  attempt: number;
  log?: { stream: "stdout" | "stderr"; text: string; droppedBefore?: number };
  state?: {
    taskState: string;
    attemptState: string;
    machineId?: string;
    exitCode?: number;
    message?: string;
    newAttempt?: boolean;
    reason?: string;
    summary?: string;
  };
  seccomp?: Array<{ syscall: string; count: number }>;
}

export interface PoolSecurity {
  profile?: string;
  seccomp?: string;
  dropNetRaw?: boolean;
  bridgePortIsolation?: boolean;
  egressMode?: string;
  egressAllow?: string[];
  runtime?: string;
  apparmorProfile?: string;
  volumeMountValidation?: boolean;
}

export interface Pool {
  name: string;
  gpuType?: string;
  nodeSelector?: Record<string, string>;
  security?: PoolSecurity;
  machines: number;
  machinesOnline: number;
  gpusTotal: number;
  gpusFree: number;
  shared?: boolean;
}

export interface Gpu {
  index: number;
  uuid?: string;
  name?: string;
  memoryBytes?: number;
  driverVersion?: string;
  cudaVersion?: string;
}

export interface Machine {
  id: string;
  name?: string;
  pool: string;
  state: "pending" | "online" | "offline";
  online: boolean;
  transport?: string;
  agentVersion?: string;
  createdAt?: string;
  enrolledAt?: string;
  lastHeartbeat?: string;
  certificateExpiresAt?: string;
  labels?: Record<string, string>;
  inventory?: {
    hostname?: string;
    os?: string;
    arch?: string;
    kernel?: string;
    cpus?: number;
    cpuModel?: string;
    memoryBytes?: number;
    diskBytes?: number;
    diskFreeBytes?: number;
    runcVersion?: string;
    runscVersion?: string;
    apparmor?: boolean;
    gpus?: Gpu[];
  };
}

export interface Token {
  id: string;
  name: string;
  role: "admin" | "member" | "machine_join";
  createdAt?: string;
  lastUsedAt?: string;
  revokedAt?: string;
  revoked?: boolean;
}

export interface SecretName {
  name: string;
  keys: string[];
  createdAt?: string;
  updatedAt?: string;
}

export interface SecurityReport {
  report: {
    pool: string;
    mode: string;
    from?: string;
    to?: string;
    total: string;
    byClass: Array<{ class: string; count: string }>;
    byTask: Array<{ task: string; class: string; count: string }>;
    destinations: Array<{ class: string; destination: string; task: string; samples: string }>;
    safeToEnforce: boolean;
    machinesReporting: number;
    machinesSilent: string[];
    blind: string;
    machinesBlind: string[];
  };
  seccomp: {
    mode: string;
    total: string;
    syscalls: Array<{ syscall: string; count: string; tasks: number; taskIds: string[] }>;
    safeToEnforce: boolean;
    tasksObserved: number;
  };
}

/** ApiError is a refused call: the API's code and one sentence for a person. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** call sends one request; changes carry csrf as X-CSRF-Token. */
export async function call<T>(method: string, path: string, opts: { body?: unknown; csrf?: string } = {}): Promise<T> {
  const headers: Record<string, string> = {};
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  if (opts.csrf) headers["X-CSRF-Token"] = opts.csrf;
  let resp: Response;
  try {
    resp = await fetch(apiBase + path, {
      method,
      headers,
      credentials: "include",
      cache: "no-store",
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    });
  } catch {
    throw new ApiError(0, "unavailable", "The dashboard API cannot be reached.");
  }
  if (resp.status === 204) return undefined as T;
  const text = await resp.text();
  let doc: unknown = undefined;
  try {
    doc = text ? JSON.parse(text) : undefined;
  } catch {
    // a proxy's HTML error page: reported below by status
  }
  if (!resp.ok) {
    const e = (doc as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new ApiError(resp.status, e?.code ?? "internal", e?.message ?? `The API answered ${resp.status}.`);
  }
  return doc as T;
}

/** wsURL is the WebSocket URL of an API path (ws for http, wss for https). */
export function wsURL(path: string): string {
  const base = apiBase || window.location.origin;
  return base.replace(/^http/, "ws") + path;
}
