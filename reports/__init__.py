"""reports: plain records in, pages out (the run report, the ablation report, SVG charts)."""
