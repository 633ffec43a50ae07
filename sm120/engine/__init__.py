"""Running engines: deployment state on disk and finding it again, the API key file, the
Docker door, the engine environment, GPU readings, serve.log written and followed, runtimes
(runtime/: native, Docker) and multi-node processes (cluster/)."""
