"""Training once per target model: self-distilled data, distilled draft models, Medusa heads."""
