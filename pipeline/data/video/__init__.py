"""Image-to-video data (docs/methods.md, "Image-to-video data"; after VEGGIE).

render.py     raster charts (PIL) and the camera warp
edits.py      edit operations and their instructions
filters.py    temporal consistency, motion, preservation outside the edit (SSIM, PSNR)
questions.py  temporal function chains over the frames, graded by pipeline/data/grading.py
backends.py   procedural (CPU) and diffusers (GPU) clip makers
sample.py     one sample from one synthesized table
clips.py      MP4 (PyAV), GIF and contact-sheet files
"""
