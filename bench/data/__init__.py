"""The paper's problem files and published results, shipped with bench (MIT; see LICENSE and
SOURCE.md here). Load them by name through `bench.problems`."""
