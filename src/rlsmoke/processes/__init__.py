"""Running what the launch renders: process trees and their logs (`runner`), a CPU run in the caller's
process or its fork server (`here`), GPU and port leases (`lease`), Miles' flow and its train-only step."""
